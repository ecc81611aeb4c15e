"""Salon cartridge: clients, stylists, appointments and visits of a hair salon.

Every handler is a pure function of the event and the graph as of the event's world time: no wall
clock, no randomness, no network. Provenance (source, evidence) defaults to the event being applied.
"""
from keel import Registry

registry = Registry()


def _day(when):
    """The calendar day (YYYY-MM-DD, UTC) of an event time; its text form is RFC 3339."""
    return str(when)[:10]



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


@registry.on("client.preference_set")
def client_preference_set(event, store):
    tenant, client, when = event.tenant, event.subject, event.occurred_at
    stylist = f"stylist:{event.payload['stylist']}"
    current = [r["object"] for r in store.relations(tenant, client, rel="prefers", at=when)
               if r["subject"] == client]
    for old in current:
        if old != stylist:
            store.unlink(tenant, client, "prefers", old, when)
    if stylist not in current:
        store.link(tenant, client, "prefers", stylist, when)


@registry.on("appointment.booked")
def appointment_booked(event, store):
    p, tenant, appt, when = event.payload, event.tenant, event.subject, event.occurred_at
    store.upsert_entity(tenant, "appointment", event.subject_id, ref=f"agenda.appointments#{event.subject_id}",
                        service=p["service"], day=p["starts_at"][:10])
    store.link(tenant, appt, "for_client", f"client:{p['client']}", when)
    store.link(tenant, appt, "with_stylist", f"stylist:{p['stylist']}", when)
    store.open_fact(tenant, appt, "status", "booked", valid_from=when)
    store.open_fact(tenant, appt, "starts_at", p["starts_at"], valid_from=when)
    if p.get("note"):
        store.open_fact(tenant, appt, "note", p["note"], valid_from=when)


@registry.on("appointment.cancelled")
def appointment_cancelled(event, store):
    p, tenant, appt, when = event.payload, event.tenant, event.subject, event.occurred_at
    store.open_fact(tenant, appt, "status", "cancelled", valid_from=when)
    store.open_fact(tenant, appt, "cancelled_by", p["cancelled_by"], valid_from=when)
    if p.get("reason"):
        store.open_fact(tenant, appt, "cancel_reason", p["reason"], valid_from=when)
    store.close_fact(tenant, appt, "starts_at", valid_to=when)       # the slot no longer exists
    for r in store.relations(tenant, appt, rel="with_stylist", at=when):
        store.unlink(tenant, appt, "with_stylist", r["object"], when)   # release the stylist


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
