"""Fleet cartridge: vehicles, drivers, trips, fuel fill-ups and workshop services.

Every handler is a pure function of the event and the graph as of the event's world time: no wall
clock, no randomness, no network. Provenance (source, evidence) defaults to the event being applied.
"""
from keel import Registry

registry = Registry()


def _assign(store, tenant, vehicle, driver, when):
    """Make `driver` the only driver `vehicle` is assigned to from `when` on."""
    current = [r["object"] for r in store.relations(tenant, vehicle, rel="assigned_to", at=when)
               if r["subject"] == vehicle]
    if driver in current:
        return
    for old in current:
        store.unlink(tenant, vehicle, "assigned_to", old, when)
    store.link(tenant, vehicle, "assigned_to", driver, when)


@registry.on("driver.hired")
def driver_hired(event, store):
    p, when = event.payload, event.occurred_at
    store.upsert_entity(event.tenant, "driver", event.subject_id, ref=f"hr.employees#{event.subject_id}",
                        name=p["name"], base=p["base"])
    store.open_fact(event.tenant, event.subject, "license_class", p["license_class"], valid_from=when)
    store.open_fact(event.tenant, event.subject, "status", "active", valid_from=when)


@registry.on("driver.left")
def driver_left(event, store):
    tenant, driver, when = event.tenant, event.subject, event.occurred_at
    store.open_fact(tenant, driver, "status", "left", valid_from=when)
    for r in store.relations(tenant, driver, rel="assigned_to", at=when):
        if r["object"] == driver:      # vehicle -> driver: the vehicle is left without a driver
            store.unlink(tenant, r["subject"], "assigned_to", driver, when)


@registry.on("vehicle.registered")
def vehicle_registered(event, store):
    p, tenant, vehicle, when = event.payload, event.tenant, event.subject, event.occurred_at
    store.upsert_entity(tenant, "vehicle", event.subject_id, ref=f"fleetdb.vehicles#{event.subject_id}",
                        plate=p["plate"], model=f"{p['make']} {p['model']} {p['year']}", kind=p["kind"])
    store.open_fact(tenant, vehicle, "status", "active", valid_from=when)
    store.open_fact(tenant, vehicle, "odometer_km", p["odometer_km"], valid_from=when)
    store.open_fact(tenant, vehicle, "next_service_km", p["next_service_km"], valid_from=when)
    if p.get("assigned_driver"):
        _assign(store, tenant, vehicle, f"driver:{p['assigned_driver']}", when)


@registry.on("vehicle.assigned")
def vehicle_assigned(event, store):
    _assign(store, event.tenant, event.subject, f"driver:{event.payload['driver']}", event.occurred_at)


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
