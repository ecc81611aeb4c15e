"""Per-token limits on the HTTP transport, and the count of /mcp responses by status (pure ASGI, no SDK).

`CallLimits` sits after the SDK's bearer authentication, so it keys on the token that was verified (its
sha256, never the token) and lets unauthenticated requests through to their 401. Only POSTs to /mcp count
(tool calls, initialize, notifications); a session's GET stream and DELETE do not. Over either limit the
answer is 429 with `Retry-After` (seconds) and a JSON-RPC error body, before the request reaches the SDK.

The per-second limit is a token bucket per token (capacity: one second's calls, refilled continuously). A
small one by hand: `limits`' in-memory storage starts a timer thread every 10 ms while any key is live (about
90 threads a second under load, measured), and `aiolimiter` waits for capacity rather than refusing, and
cannot say when capacity returns (for Retry-After) without its private state.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .observe import Metrics


class TokenBuckets:
    """`rate` calls a second per key, bursts up to `rate`; `take(key)` is 0.0 when allowed, else the seconds
    until one call is allowed again."""

    def __init__(self, rate: float, clock: Any = time.monotonic) -> None:
        self.rate = float(rate)
        self.clock = clock
        self._buckets: dict[str, list[float]] = {}      # key -> [tokens, when last refilled]

    def take(self, key: str) -> float:
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [self.rate - 1.0, now]
            return 0.0
        tokens = min(self.rate, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0.0
        bucket[0] = tokens
        return (1.0 - tokens) / self.rate


class CallLimits:
    """ASGI middleware: at most `in_flight` POSTs at once and `per_second` a second per token, on `path`."""

    def __init__(self, app: ASGIApp, *, path: str, in_flight: int, per_second: float) -> None:
        self.app = app
        self.path = path
        self.max_in_flight = in_flight
        self.per_second = per_second
        self.buckets = TokenBuckets(per_second)
        self.in_flight: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = scope.get("user")
        token = getattr(token, "access_token", None)
        if token is None or scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        key = token.token                   # the sha256 the tokens file holds (tools_server.auth)
        busy = self.in_flight.get(key, 0)
        if busy >= self.max_in_flight:
            await too_many(send, f"this token already has {busy} calls in flight (at most {self.max_in_flight})", 1)
            return
        wait = self.buckets.take(key)
        if wait:
            await too_many(send, f"this token sent more than {self.per_second:g} calls in a second", wait)
            return
        self.in_flight[key] = busy + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[key] - 1
            if left:
                self.in_flight[key] = left
            else:
                del self.in_flight[key]


async def too_many(send: Send, why: str, retry_after_s: float) -> None:
    """429 with Retry-After (whole seconds, at least 1) and a JSON-RPC error (id null: the body is not read)."""
    body = json.dumps({"jsonrpc": "2.0", "id": None,
                       "error": {"code": -32000, "message": f"Too many requests: {why}; retry later"}}).encode()
    await send({"type": "http.response.start", "status": 429,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(max(1, math.ceil(retry_after_s))).encode())]})
    await send({"type": "http.response.body", "body": body})


class CountResponses:
    """ASGI middleware: keel_mcp_http_responses_total{status} for every response on `path`, whoever sent it
    (the SDK, the auth middleware, CallLimits, Starlette's error handler)."""

    def __init__(self, app: ASGIApp, *, path: str, metrics: Metrics) -> None:
        self.app = app
        self.path = path
        self.counter = metrics.http_responses
        self._by_status: dict[int, Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                child = self._by_status.get(status)
                if child is None:
                    child = self._by_status[status] = self.counter.labels(str(status))
                child.inc()
            await send(message)
        await self.app(scope, receive, counted)
