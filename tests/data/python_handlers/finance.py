"""The finance event types whose `project:` steps are in cartridge.yaml, as the Python handlers they replaced.

tests/test_projection.py appends this to the cartridge's own handlers.py (it uses that `registry`) to
build the all-Python twin of the cartridge."""
# ruff: noqa: F821 - `registry` is the one of the handlers.py this text is appended to


@registry.on("debt.snapshot")
def debt_snapshot(event, store):
    p = event.payload
    store.upsert_entity(event.tenant, "debt", event.subject_id,
                        ref=f"{event.source}#{event.subject_id}", creditor=p["creditor"], product=p["product"])
    # Linking again while linked changes nothing visible (relation versions coalesce), so no read is needed;
    # handlers that branch on reads can answer known_at differently from a rebuild of the earlier log.
    store.link(event.tenant, event.subject, "owed_by", f"household:{event.tenant}", event.occurred_at)
    for predicate in ("balance_cop", "rate_ea_pct", "installment_cop"):
        store.open_fact(event.tenant, event.subject, predicate, p[predicate], valid_from=event.occurred_at)


@registry.on("due.scheduled")
def due_scheduled(event, store):
    p = event.payload
    store.upsert_entity(event.tenant, "due", event.subject_id, ref=f"{event.source}#{event.subject_id}",
                        debt=p["debt_id"], due_on=p["due_on"])
    store.link(event.tenant, event.subject, "for_debt", f"debt:{p['debt_id']}", event.occurred_at)
    store.open_fact(event.tenant, event.subject, "status", "pending", valid_from=event.occurred_at)
    store.open_fact(event.tenant, event.subject, "due_on", p["due_on"], valid_from=event.occurred_at)
    store.open_fact(event.tenant, event.subject, "amount_cop", p["amount_cop"], valid_from=event.occurred_at)


@registry.on("due.paid")
def due_paid(event, store):
    p = event.payload
    store.upsert_entity(event.tenant, "account", p["account_id"], ref=f"accounts#{p['account_id']}")
    store.link(event.tenant, event.subject, "paid_from", f"account:{p['account_id']}", p["paid_on"])
    store.open_fact(event.tenant, event.subject, "status", "paid", valid_from=p["paid_on"])
    store.open_fact(event.tenant, event.subject, "paid_on", p["paid_on"], valid_from=p["paid_on"])
    store.open_fact(event.tenant, event.subject, "amount_paid_cop", p["amount_cop"], valid_from=p["paid_on"])
