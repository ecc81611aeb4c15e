"""Salon cartridge: clients, stylists, appointments and visits of a hair salon.

The event types whose writes are a plain mapping of the event are declared under `project:` in cartridge.yaml;
the handlers here read the graph first. Every handler is a pure function of the event and the graph as of the
event's world time: no wall clock, no randomness, no network. Provenance (source, evidence) defaults to the
event being applied.
"""
from keel import Registry

registry = Registry()


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
