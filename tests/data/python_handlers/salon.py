"""The salon event types whose `project:` steps are in cartridge.yaml, as the Python handlers they replaced.

tests/test_projection.py appends this to the cartridge's own handlers.py (it uses that `registry`) to
build the all-Python twin of the cartridge."""
# ruff: noqa: F821 - `registry` is the one of the handlers.py this text is appended to


def _day(when):
    """The calendar day (YYYY-MM-DD, UTC) of an event time; its text form is RFC 3339."""
    return str(when)[:10]


@registry.on("stylist.joined")
def stylist_joined(event, store):
    p, when = event.payload, event.occurred_at
    labels = {"name": p["name"], "specialty": p["specialty"]}
    if p.get("instagram"):
        labels["instagram"] = p["instagram"]
    store.upsert_entity(event.tenant, "stylist", event.subject_id, ref=f"staff.stylists#{event.subject_id}",
                        **labels)
    store.open_fact(event.tenant, event.subject, "chair", p["chair"], valid_from=when)
    store.open_fact(event.tenant, event.subject, "status", "active", valid_from=when)


@registry.on("client.registered")
def client_registered(event, store):
    p, tenant, client, when = event.payload, event.tenant, event.subject, event.occurred_at
    store.upsert_entity(tenant, "client", event.subject_id, ref=f"crm.clients#{event.subject_id}",
                        name=p["name"], phone=p["phone"])
    store.open_fact(tenant, client, "client_since", _day(when), valid_from=when)
    if p.get("channel"):
        store.open_fact(tenant, client, "acquired_via", p["channel"], valid_from=when)
    if p.get("preferred_stylist"):
        store.link(tenant, client, "prefers", f"stylist:{p['preferred_stylist']}", when)


@registry.on("visit.completed")
def visit_completed(event, store):
    p, tenant, visit, when = event.payload, event.tenant, event.subject, event.occurred_at
    client = f"client:{p['client']}"
    store.upsert_entity(tenant, "visit", event.subject_id, ref=f"pos.tickets#{event.subject_id}",
                        service=p["service"], day=_day(when))
    store.link(tenant, visit, "visit_of", client, when)
    store.link(tenant, visit, "served_by", f"stylist:{p['stylist']}", when)
    store.open_fact(tenant, visit, "price_eur", p["price_eur"], valid_from=when)
    if p.get("tip_eur") is not None:
        store.open_fact(tenant, visit, "tip_eur", p["tip_eur"], valid_from=when)
    store.open_fact(tenant, client, "last_visit_on", _day(when), valid_from=when)
    if p.get("appointment"):
        store.link(tenant, visit, "fulfils", f"appointment:{p['appointment']}", when)
        store.open_fact(tenant, f"appointment:{p['appointment']}", "status", "completed", valid_from=when)
