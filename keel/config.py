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
    keys_file: str | None = None    # the key file of sealed personal fields (docs/privacy.md)
    keys_dsn: str | None = None     # or the PostgreSQL key store (keel/keystore_pg.py)
    master_key_file: str | None = None
    cold_dsn: str | None = None     # the cold tier of closed segments (keel/cold_pg.py); None: off


def resolve(flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> Settings:
    """Settings from parsed flags (None = not given) and the environment."""
    env = os.environ if env is None else env

    def pick(flag: str, var: str, default: object) -> object:
        value = flags.get(flag)
        if value is not None:
            return value
        return env.get(var, default)

    allow = pick("allow_global_notes", "KEEL_ALLOW_GLOBAL_NOTES", False)
    layout = str(env.get("KEEL_REDIS_LAYOUT", "2")).strip()
    # The setting of a removed choice: "2" chose the segments, which every Keel now writes (their successor is
    # stamped 3, keel/store/redis/layout.py), so it is harmless; "1" (or anything else) is refused, so nobody
    # believes layout 1 is in use.
    if layout != "2":
        raise UsageError(f"KEEL_REDIS_LAYOUT={layout!r}: Keel writes one Redis key layout (segments) and no longer "
                         f"reads layout 1; unset KEEL_REDIS_LAYOUT (see CHANGELOG.md for the upgrade)")
    return Settings(kafka_bootstrap=str(pick("kafka", "KEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092")),
                    redis_url=pick("redis", "KEEL_REDIS_URL", None),  # type: ignore[arg-type]
                    allow_global_notes=allow if isinstance(allow, bool) else str(allow).lower() in ("1", "true", "yes"),
                    apply_timeout_s=float(pick("apply_timeout", "KEEL_APPLY_TIMEOUT", 10.0)),  # type: ignore[arg-type]
                    keys_file=pick("keys", "KEEL_KEYS_FILE", None),  # type: ignore[arg-type]
                    keys_dsn=pick("keys_dsn", "KEEL_KEYS_DSN", None),  # type: ignore[arg-type]
                    master_key_file=pick("master_key_file", "KEEL_MASTER_KEY_FILE", None),  # type: ignore[arg-type]
                    cold_dsn=pick("cold_dsn", "KEEL_COLD_DSN", None) or None)  # type: ignore[arg-type]
