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
