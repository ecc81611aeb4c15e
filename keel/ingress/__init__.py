"""Ingress: ways for products that do not publish to Kafka themselves to get events into Keel.

* `outbox` + `relay`: a transactional outbox table in the product's PostgreSQL, tailed by
  `keel outbox relay` with an (xid8, position) cursor that never skips a late-committing transaction.
* `webhook`: `keel webhook`, an HTTP endpoint taking HMAC-signed envelopes per tenant.

Both check every envelope with the cartridge's catalog and produce its canonical form to
`keel.<cartridge>.events` (key = tenant, acks=all); the core's contracts are unchanged.
"""

DEFAULT_TABLE = "keel_outbox"      # the outbox table name when none is given
