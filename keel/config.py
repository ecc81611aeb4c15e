"""Configuration: flags first, then KEEL_* environment variables, then defaults; resolved once at the
entry point and passed down (no module-level settings).

A default address is a guess about whose service answers there: the one setting with a default address, Kafka's
bootstrap (127.0.0.1:9092), is named on stderr the first time a process uses it (`Settings.kafka_bootstrap`),
so that nobody reads or writes someone else's broker without being told. Redis has no default: a command that
needs it and is given none refuses (usage error)."""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import UsageError

DEFAULT_KAFKA = "127.0.0.1:9092"
_named: set[str] = set()        # default addresses already named on stderr by this process (once each)


def name_default(what: str, address: str, how: str) -> None:
    """One line on stderr, once per process and address: a connection goes to a default address."""
    if address not in _named:
        _named.add(address)
        print(f"keel: using {what} at {address} (default; {how})", file=sys.stderr)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)
    kafka_address: str = Field(DEFAULT_KAFKA, alias="kafka_bootstrap")
    kafka_is_default: bool = False  # True when resolve() found no flag or variable: named on stderr when used
    redis_url: str | None = None
    allow_global_notes: bool = False
    apply_timeout_s: float = 10.0
    keys_file: str | None = None    # the key file of sealed personal fields (docs/privacy.md)
    keys_dsn: str | None = None     # or the PostgreSQL key store (keel/keystore_pg.py)
    master_key_file: str | None = None
    cold_dsn: str | None = None     # the cold tier of closed segments (keel/cold_pg.py); None: off
    clear: bool = False             # `--clear`: an events file's personal fields read in clear, this run only

    @property
    def kafka_bootstrap(self) -> str:
        """Kafka's bootstrap servers; when they are the default, the first use says so on stderr."""
        if self.kafka_is_default:
            name_default("Kafka", self.kafka_address, "set KEEL_KAFKA_BOOTSTRAP or pass --kafka")
        return self.kafka_address


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
    kafka: Any = pick("kafka", "KEEL_KAFKA_BOOTSTRAP", None) or None
    return Settings(kafka_address=str(kafka or DEFAULT_KAFKA), kafka_is_default=kafka is None,
                    redis_url=pick("redis", "KEEL_REDIS_URL", None),  # type: ignore[arg-type]
                    allow_global_notes=allow if isinstance(allow, bool) else str(allow).lower() in ("1", "true", "yes"),
                    apply_timeout_s=float(pick("apply_timeout", "KEEL_APPLY_TIMEOUT", 10.0)),  # type: ignore[arg-type]
                    keys_file=pick("keys", "KEEL_KEYS_FILE", None),  # type: ignore[arg-type]
                    keys_dsn=pick("keys_dsn", "KEEL_KEYS_DSN", None),  # type: ignore[arg-type]
                    master_key_file=pick("master_key_file", "KEEL_MASTER_KEY_FILE", None),  # type: ignore[arg-type]
                    cold_dsn=pick("cold_dsn", "KEEL_COLD_DSN", None) or None,  # type: ignore[arg-type]
                    clear=flags.get("clear") is True)    # a flag only: no variable makes it last beyond a run
