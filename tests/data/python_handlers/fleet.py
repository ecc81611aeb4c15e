"""The fleet event types whose `project:` steps are in cartridge.yaml, as the Python handlers they replaced.

tests/test_projection.py appends this to the cartridge's own handlers.py (it uses that `registry`) to
build the all-Python twin of the cartridge."""
# ruff: noqa: F821 - `registry` is the one of the handlers.py this text is appended to


@registry.on("driver.hired")
def driver_hired(event, store):
    p, when = event.payload, event.occurred_at
    store.upsert_entity(event.tenant, "driver", event.subject_id, ref=f"hr.employees#{event.subject_id}",
                        name=p["name"], base=p["base"])
    store.open_fact(event.tenant, event.subject, "license_class", p["license_class"], valid_from=when)
    store.open_fact(event.tenant, event.subject, "status", "active", valid_from=when)


@registry.on("trip.completed")
def trip_completed(event, store):
    p, tenant, trip, when = event.payload, event.tenant, event.subject, event.occurred_at
    vehicle = f"vehicle:{p['vehicle']}"
    store.upsert_entity(tenant, "trip", event.subject_id, ref=f"telematics.trips#{event.subject_id}",
                        origin=p["origin"], destination=p["destination"])
    store.link(tenant, trip, "uses_vehicle", vehicle, when)
    store.link(tenant, trip, "driven_by", f"driver:{p['driver']}", when)
    store.open_fact(tenant, trip, "distance_km", p["distance_km"], valid_from=when)
    if p.get("cargo"):
        store.open_fact(tenant, trip, "cargo", p["cargo"], valid_from=when)
    store.open_fact(tenant, vehicle, "odometer_km", p["odometer_km"], valid_from=when)


@registry.on("fuel.filled")
def fuel_filled(event, store):
    p, tenant, fill, when = event.payload, event.tenant, event.subject, event.occurred_at
    vehicle = f"vehicle:{p['vehicle']}"
    store.upsert_entity(tenant, "fuel_fill", event.subject_id, ref=f"fuelcards.transactions#{event.subject_id}",
                        station=p["station"], plate=p["vehicle"])
    store.link(tenant, fill, "fuelled", vehicle, when)
    store.open_fact(tenant, fill, "fuel_litres", p["litres"], valid_from=when)
    store.open_fact(tenant, fill, "cost_clp", p["cost_clp"], valid_from=when)
    if p.get("odometer_km") is not None:
        store.open_fact(tenant, vehicle, "odometer_km", p["odometer_km"], valid_from=when)


@registry.on("service.scheduled")
def service_scheduled(event, store):
    p, tenant, service, when = event.payload, event.tenant, event.subject, event.occurred_at
    store.upsert_entity(tenant, "service", event.subject_id, ref=f"workshop.orders#{event.subject_id}",
                        kind=p["kind"], plate=p["vehicle"])
    store.link(tenant, service, "for_vehicle", f"vehicle:{p['vehicle']}", when)
    store.open_fact(tenant, service, "status", "scheduled", valid_from=when)
    store.open_fact(tenant, service, "due_km", p["due_km"], valid_from=when)
    if p.get("due_on"):
        store.open_fact(tenant, service, "due_on", p["due_on"], valid_from=when)
    store.open_fact(tenant, f"vehicle:{p['vehicle']}", "next_service_km", p["due_km"], valid_from=when)


@registry.on("service.done")
def service_done(event, store):
    p, tenant, service, when = event.payload, event.tenant, event.subject, event.occurred_at
    vehicle = f"vehicle:{p['vehicle']}"
    store.open_fact(tenant, service, "status", "done", valid_from=when)
    store.close_fact(tenant, service, "due_km", valid_to=when)     # no longer due
    store.open_fact(tenant, service, "workshop", p["workshop"], valid_from=when)
    store.open_fact(tenant, service, "cost_clp", p["cost_clp"], valid_from=when)
    store.open_fact(tenant, vehicle, "odometer_km", p["odometer_km"], valid_from=when)
    store.open_fact(tenant, vehicle, "next_service_km", p["next_service_km"], valid_from=when)
