"""Directory handlers: a member joins a club (name, city), a member is renamed."""
from keel import Registry

registry = Registry()


@registry.on("member.joined")
def member_joined(event, store):
    p = event.payload
    labels = {"name": p["name"], **({"city": p["city"]} if "city" in p else {})}
    store.upsert_entity(event.tenant, "member", event.subject_id, **labels)
    store.upsert_entity(event.tenant, "club", p["club"], name=p["club"])
    store.link(event.tenant, event.subject, "member_of", f"club:{p['club']}", event.occurred_at)


@registry.on("member.renamed")
def member_renamed(event, store):
    store.upsert_entity(event.tenant, "member", event.subject_id, name=event.payload["name"])
