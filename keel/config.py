"""Configuration: flags first, then KEEL_* environment variables, then defaults; resolved once at the
entry point and passed down (no module-level settings)."""
from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from .errors import UsageError


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)
    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str | None = None
    allow_global_notes: bool = False
    apply_timeout_s: float = 10.0
    redis_layout: int = 1           # the Redis key layout a new namespace is written in (keel/store/redis/layout.py)
    keys_file: str | None = None    # the key file of sealed personal fields (docs/privacy.md)
    keys_dsn: str | None = None     # or the PostgreSQL key store (keel/keystore_pg.py)
    master_key_file: str | None = None
    cold_dsn: str | None = None     # the cold tier of layout 2's closed segments (keel/cold_pg.py); None: off


def resolve(flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> Settings:
    """Settings from parsed flags (None = not given) and the environment."""
    env = os.environ if env is None else env

    def pick(flag: str, var: str, default: object) -> object:
        value = flags.get(flag)
        if value is not None:
            return value
        return env.get(var, default)

    allow = pick("allow_global_notes", "KEEL_ALLOW_GLOBAL_NOTES", False)
    layout = str(pick("redis_layout", "KEEL_REDIS_LAYOUT", "1")).strip()
    if layout not in ("1", "2"):
        raise UsageError(f"bad KEEL_REDIS_LAYOUT {layout!r}: use 1 (a sorted set per entity) or 2 (segments)")
    return Settings(kafka_bootstrap=str(pick("kafka", "KEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092")),
                    redis_url=pick("redis", "KEEL_REDIS_URL", None),  # type: ignore[arg-type]
                    allow_global_notes=allow if isinstance(allow, bool) else str(allow).lower() in ("1", "true", "yes"),
                    apply_timeout_s=float(pick("apply_timeout", "KEEL_APPLY_TIMEOUT", 10.0)),  # type: ignore[arg-type]
                    redis_layout=int(layout),
                    keys_file=pick("keys", "KEEL_KEYS_FILE", None),  # type: ignore[arg-type]
                    keys_dsn=pick("keys_dsn", "KEEL_KEYS_DSN", None),  # type: ignore[arg-type]
                    master_key_file=pick("master_key_file", "KEEL_MASTER_KEY_FILE", None),  # type: ignore[arg-type]
                    cold_dsn=pick("cold_dsn", "KEEL_COLD_DSN", None) or None)  # type: ignore[arg-type]
