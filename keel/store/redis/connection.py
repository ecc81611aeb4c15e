"""Redis clients from Keel's URLs: `redis://` / `rediss://` (a node, or a Cluster node: asked), and
`redis+sentinel://` / `rediss+sentinel://` (Redis Sentinel: the client asks the sentinels for the current primary
and follows a failover on its own, so a worker or server needs no restart).

Sentinel URL: `redis+sentinel://[user:password@]host:port[,host:port…]/<service name>[/<db>]`, the password being
the primary's; `?sentinel_password=…` when the sentinels have their own. redis-py's Sentinel client does the
discovery (redis.sentinel): on a connection error, or on a write refused by a primary that became a replica, it
asks the sentinels again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from ...errors import UsageError
from .transport import Client

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None
    sentinel_password: str | None
    ssl: bool


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel(url: str) -> SentinelTarget:
    """The parts of a `redis+sentinel://` URL (UsageError naming what is wrong; never echoing a password)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    hosts: list[tuple[str, int]] = []
    for item in filter(None, netloc.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"bad sentinel address {item!r} in a redis+sentinel:// URL: use host:port[,host:port…]")
        hosts.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise UsageError("a redis+sentinel:// URL reads redis+sentinel://[user:password@]host:port[,host:port…]"
                         "/<service name>[/<db>]")
    query = parse_qs(parts.query)
    return SentinelTarget(hosts, unquote(path[0]), int(path[1]) if len(path) == 2 else 0,
                          unquote(parts.username) if parts.username else None,
                          unquote(parts.password) if parts.password else None,
                          query.get("sentinel_password", [None])[0], parts.scheme.lower().startswith("rediss"))


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def connect(url: str, *, cluster: bool | None, **options: Any) -> Client:
    """A client for `url`; `cluster=None` asks the node whether it is a Cluster node (a sentinel-managed primary
    never is). Connects lazily where the client does; raises redis errors as they come (callers guard)."""
    if is_sentinel(url):
        t = parse_sentinel(url)
        sentinel_kwargs = {k: v for k, v in options.items() if k.startswith("socket_")}
        if t.sentinel_password:
            sentinel_kwargs["password"] = t.sentinel_password
        sentinel = Sentinel(t.sentinels, sentinel_kwargs=sentinel_kwargs, ssl=t.ssl, **options)
        return sentinel.master_for(t.service, db=t.db, username=t.username, password=t.password,
                                   decode_responses=True)
    if cluster is None:
        probe = redis.Redis.from_url(url, **options)
        try:
            cluster = bool(probe.info("cluster").get("cluster_enabled"))
        finally:
            probe.close()
    if cluster:
        return RedisCluster.from_url(url, decode_responses=True, **options)
    return redis.Redis.from_url(url, decode_responses=True, **options)
