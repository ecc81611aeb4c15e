"""The appointments event types whose `project:` steps are in cartridge.yaml, as Python handlers.

tests/test_projection.py appends this to the cartridge's own handlers.py (it uses that `registry`) to
build the all-Python twin of the cartridge. `for_household` and `charged_to` end at the finance cartridge's
types: a handler links them by the finance ids, as the steps do."""
# ruff: noqa: F821 - `registry` is the one of the handlers.py this text is appended to


@registry.on("appointment.booked")
def appointment_booked(event, store):
    p = event.payload
    store.upsert_entity(event.tenant, "appointment", event.subject_id, ref=f"{event.source}#{event.subject_id}",
                        title=p["title"])
    store.upsert_entity(event.tenant, "provider", p["provider"], ref=f"providers#{p['provider']}",
                        name=p["provider"])
    store.link(event.tenant, event.subject, "with_provider", f"provider:{p['provider']}", event.occurred_at)
    store.link(event.tenant, event.subject, "for_household", f"household:{event.tenant}", event.occurred_at)
    store.open_fact(event.tenant, event.subject, "status", "booked", valid_from=event.occurred_at)
    store.open_fact(event.tenant, event.subject, "starts_at", p["starts_at"], valid_from=event.occurred_at)
    store.open_fact(event.tenant, event.subject, "fee_cop", p["fee_cop"], valid_from=event.occurred_at)


@registry.on("appointment.charged")
def appointment_charged(event, store):
    store.link(event.tenant, event.subject, "charged_to", f"debt:{event.payload['debt_id']}", event.occurred_at)


@registry.on("appointment.cancelled")
def appointment_cancelled(event, store):
    store.open_fact(event.tenant, event.subject, "status", "cancelled", valid_from=event.occurred_at)
