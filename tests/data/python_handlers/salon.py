"""The salon event types whose `project:` steps are in cartridge.yaml, as the Python handlers they replaced.

tests/test_projection.py appends this to the cartridge's own handlers.py (it uses that `registry`) to
build the all-Python twin of the cartridge."""
# ruff: noqa: F821 - `registry` is the one of the handlers.py this text is appended to


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
