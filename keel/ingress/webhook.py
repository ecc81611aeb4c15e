"""`keel webhook`: signed HTTP ingress → the cartridge's topic.

`POST /events/<cartridge name>` (or `POST /events` when the server serves one cartridge) with one envelope
or a batch (JSON lines or a JSON array), signed per tenant (see auth.py). Answers:

* 202 `{cartridge, tenant, accepted: [ids], rejected: [{index, id, reason}], duplicates: [{index, id, first}]}`
  when at least one envelope was valid; the accepted ones are acknowledged by Kafka (acks=all) before
  the answer, invalid ones in the same batch are listed with their reasons and not produced;
* 400 the same shape with `error` when no envelope was valid, or the body is empty/malformed;
* 401 missing or bad signature, unknown tenant; 404 unknown cartridge; 413 body or batch over the limits;
* 503 Kafka did not acknowledge within `Limits.kafka_timeout_s` (`--kafka-timeout`, default 5 s) or failed
  (retry the request: ids make the retry harmless; records Kafka acknowledges after the 503 are applied once),
  or the key store could not seal the cartridge's personal fields (sealing.py; nothing was produced).

Routing is by path, not by event type, so cartridges may share event type names (every cartridge accepts
`keel.annotated`). `GET /healthz` answers 200 without authentication.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from keel.cartridge import Cartridge
from keel.envelope import Catalog
from keel.errors import StoreUnavailable
from keel.oauth import WRITE_SCOPE, JwtVerifier, TokenRefused
from keel.times import Micros

from .auth import SIGNATURE_HEADER, TENANT_HEADER, Secrets
from .batch import BatchOutcome, BodyMalformed, check_batch, split_body
from .errors import KafkaUnavailable
from .metrics import Probes, WebhookMetrics
from .records import OutRecord, event_record
from .sealing import IngressSealing

Log = Callable[[str], None]


class Sink(Protocol):
    """Where accepted records go (KafkaSink in production)."""
    max_record_bytes: int

    def fits(self, record: OutRecord) -> bool: ...

    async def send_all(self, records: Sequence[OutRecord]) -> None: ...


@dataclass(frozen=True)
class Limits:
    max_body: int = 1 << 20        # bytes per request
    max_batch: int = 1000          # envelopes per request
    kafka_timeout_s: float = 5.0   # longest wait for Kafka's acknowledgement before answering 503


@dataclass
class Counters:
    """Totals since start, for the periodic log line."""
    requests: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    by_status: dict[int, int] = field(default_factory=dict)

    def line(self) -> str:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_status.items())) or "none"
        return (f"{self.requests} request(s) ({statuses}); {self.accepted} event(s) accepted, "
                f"{self.rejected} rejected, {self.duplicates} duplicate(s) in batches")


@dataclass(frozen=True)
class Route:
    cartridge: Cartridge
    catalog: Catalog
    sealing: IngressSealing = field(default_factory=lambda: IngressSealing(None))


def wall_clock_micros() -> Micros:
    return time.time_ns() // 1000


class WebhookHandler:
    """The request handling of the webhook, independent of how the server is run."""

    def __init__(self, cartridges: Sequence[Cartridge], secrets: Callable[[], Secrets], sink: Sink,
                 limits: Limits, *, clock: Callable[[], Micros] = wall_clock_micros,
                 probes: Probes | None = None, oauth: JwtVerifier | None = None,
                 sealing: dict[str, IngressSealing] | None = None) -> None:
        """`sealing`: by cartridge name, how its personal fields are sealed (none: it declares none)."""
        sealing = sealing or {}
        self.routes = {c.name: Route(c, Catalog(c), sealing.get(c.name, IngressSealing(None))) for c in cartridges}
        self.secrets = secrets
        self.oauth = oauth              # OAuth bearer tokens (`--issuer`), beside the signatures
        self.sink = sink
        self.limits = limits
        self.clock = clock
        self.counters = Counters()
        self.probes = probes or Probes()
        self.metrics = WebhookMetrics(self.probes.registry)
        self.seals = any(r.sealing.privacy is not None for r in self.routes.values())
        if self.seals:                       # readiness follows the key store, as it follows Kafka
            self.probes.watch("keys")
            self.probes.reachable("keys")

    async def post(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        response = await self._post(request)
        self.counters.requests += 1
        self.counters.by_status[response.status] = self.counters.by_status.get(response.status, 0) + 1
        route = self._route(request)
        self.metrics.requests.labels(route.cartridge.name if route else "", str(response.status)).inc()
        self.metrics.latency.observe(time.perf_counter() - started)
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "cartridges": sorted(self.routes)})

    async def _post(self, request: web.Request) -> web.Response:
        received_at = self.clock()
        route = self._route(request)
        if route is None:
            return _error(404, f"no cartridge at {request.path}; POST to "
                               + ", ".join(f"/events/{name}" for name in sorted(self.routes)))
        body = await _read_limited(request, self.limits.max_body)
        if body is None:
            return _error(413, f"body over {self.limits.max_body} bytes (--max-body)")
        tenant = request.headers.get(TENANT_HEADER)
        bearer = _bearer(request.headers.get("Authorization"))
        if bearer is not None and self.oauth is not None:
            try:
                token = await self.oauth.verify(bearer)
            except TokenRefused as e:
                return _error(401, f"bearer token refused: {e}")
            if WRITE_SCOPE not in token.scopes:
                return _error(403, f"insufficient_scope: the token lacks {WRITE_SCOPE}")
            if tenant is not None and tenant != token.identity.tenant:
                return _error(403, f"{TENANT_HEADER} names another tenant than the token")
            tenant = token.identity.tenant
        elif not self.secrets().verify(tenant, body, request.headers.get(SIGNATURE_HEADER)):
            return _error(401, f"missing or bad signature: send {TENANT_HEADER} and {SIGNATURE_HEADER}: "
                               f"sha256=<hex HMAC-SHA256 of the raw body with the tenant's secret>"
                               + (", or an OAuth bearer token" if self.oauth is not None else ""))
        assert tenant is not None
        try:
            items = split_body(body, request.content_type)
        except BodyMalformed as e:
            return _error(400, str(e))
        if not items:
            return _error(400, "no envelope in the body")
        if len(items) > self.limits.max_batch:
            return _error(413, f"batch of {len(items)} envelopes over {self.limits.max_batch} (--max-batch)")
        outcome = check_batch(route.catalog, items, tenant, received_at, route.sealing.opened)
        try:
            records = self._records(route, outcome)
        except StoreUnavailable as e:          # the key store: nothing is produced unsealed
            self.probes.unreachable("keys", e)
            return _error(503, f"events not stored, retry: {e}", headers={"Retry-After": "5"})
        if self.seals:
            self.probes.reachable("keys")
        self.counters.rejected += len(outcome.rejected)
        self.counters.duplicates += len(outcome.duplicates)
        events = self.metrics.events
        events.labels(route.cartridge.name, "rejected").inc(len(outcome.rejected))
        events.labels(route.cartridge.name, "duplicate").inc(len(outcome.duplicates))
        if not records:
            return web.json_response(_answer(route, tenant, outcome, "no valid envelope in the body"), status=400)
        try:       # shielded: the producer keeps its records; only the wait for them is bounded
            await asyncio.wait_for(asyncio.shield(self.sink.send_all(records)), self.limits.kafka_timeout_s)
        except KafkaUnavailable as e:
            self.metrics.kafka_errors.inc()
            self.probes.unreachable("kafka", e)
            return _error(503, f"events not stored, retry: {e}", headers={"Retry-After": "5"})
        except TimeoutError:
            self.metrics.kafka_errors.inc()
            self.probes.unreachable("kafka", f"no acknowledgement within {self.limits.kafka_timeout_s:g}s")
            return _error(503, f"events not acknowledged by Kafka within {self.limits.kafka_timeout_s:g}s, "
                               f"retry (ids make a retry harmless)", headers={"Retry-After": "5"})
        self.probes.reachable("kafka")
        self.counters.accepted += len(records)
        events.labels(route.cartridge.name, "accepted").inc(len(records))
        return web.json_response(_answer(route, tenant, outcome), status=202)

    def _route(self, request: web.Request) -> Route | None:
        name = request.match_info.get("cartridge")
        if name is None:
            return next(iter(self.routes.values())) if len(self.routes) == 1 else None
        return self.routes.get(name)

    def _records(self, route: Route, outcome: BatchOutcome) -> list[OutRecord]:
        """Records of the accepted events; one too large for Kafka moves to the rejected list."""
        records, kept, indexes = [], [], []
        for event, index in zip(outcome.accepted, outcome.indexes, strict=True):
            record = event_record(route.cartridge.topic, event, route.sealing.value(event))
            if self.sink.fits(record):
                records.append(record)
                kept.append(event)
                indexes.append(index)
            else:
                outcome.rejected.append({"index": index, "id": event.id, "reason": (
                    f"envelope of {record.size()} bytes exceeds the Kafka record limit of "
                    f"{self.sink.max_record_bytes} bytes")})
        outcome.accepted, outcome.indexes = kept, indexes
        outcome.rejected.sort(key=lambda r: r["index"])
        return records


def _answer(route: Route, tenant: str, outcome: BatchOutcome, error: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if error:
        doc["error"] = error
    doc.update(cartridge=route.cartridge.name, tenant=tenant, accepted=[e.id for e in outcome.accepted],
               rejected=outcome.rejected, duplicates=outcome.duplicates)
    return doc


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


async def _read_limited(request: web.Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to be over `limit` bytes (the rest is not read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(handler: WebhookHandler, limits: Limits) -> web.Application:
    """The aiohttp application of a handler (a factory: nothing is built at import time)."""
    app = web.Application(client_max_size=limits.max_body + 1)
    app.router.add_post("/events/{cartridge}", handler.post)
    app.router.add_post("/events", handler.post)
    app.router.add_get("/healthz", handler.health)
    return app


def _bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
