"""The commands that check a cartridge change before it is deployed: `keel validate --events/--kafka` (the log
reads under the cartridge), `keel diff` (what the change does to every tenant's graph) and `keel schema` (JSON
Schemas for producers). keel.cli registers them; the work is in keel/log_check.py, keel/diff.py, keel/schema.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from . import connect
from .cartridge import Cartridge, load_cartridge
from .commandline import deployment_keys_of, events_of, keys_of
from .config import resolve
from .diff import compare, render
from .echo import cut, printable
from .errors import EXIT_DOMAIN, EXIT_OK, EXIT_USAGE, UsageError
from .keystore import KeyStore
from .log_check import LogBuild, read_file, read_topic
from .rule_checks import stream_problems, unmet_rules
from .schema import cartridge_document, payload_document
from .times import now_micros
from .wire import events_topic


@dataclass(frozen=True)
class LogSource:
    """The log a command reads: an events file, or the events topic of a cartridge on Kafka."""
    name: str                       # shown before each refusal: the file, or the topic
    unit: str                       # line | record
    read: Callable[[list[LogBuild]], int]

    def where(self, text: str) -> str:
        return f"{self.name}:{text}" if self.unit == "line" else f"{self.name} {text}"


def add_kafka_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--kafka", dest="from_kafka", nargs="?", const="", metavar="BOOTSTRAP", help=(
        f"{help}: every record of keel.<cartridge>.events, from the beginning, no consumer group (BOOTSTRAP "
        f"default: KEEL_KAFKA_BOOTSTRAP, else 127.0.0.1:9092)"))


def log_source(args: argparse.Namespace, cartridge: Cartridge) -> LogSource | None:
    """The events file or `--kafka [BOOTSTRAP]` of a command (None: neither given)."""
    events = events_of(args)
    kafka = getattr(args, "from_kafka", None)
    if events and kafka is not None:
        raise UsageError("give one of an events file or --kafka, not both")
    if events:
        return LogSource(events, "line", lambda builds: read_file(events, builds))
    if kafka is None:
        return None
    settings = resolve({"kafka": kafka or None})
    topic = events_topic(cartridge.name)      # the address is read (and a default named) when the topic is read
    return LogSource(topic, "record", lambda builds: read_topic(settings.kafka_bootstrap, topic, builds))


def print_refusals(source: LogSource, build: LogBuild) -> None:
    """Every refusal of a build, one line each, and the recorded_at warnings."""
    for r in build.refused:
        print(printable(cut(source.where(str(r)), 600)), file=sys.stderr)
    for w in build.clamped:
        print(printable(cut(source.where(f"{w.where}: event {w.event_id}: warning: {w.reason}"), 600)),
              file=sys.stderr)


@contextmanager
def log_keys(args: argparse.Namespace, source: LogSource) -> Iterator[KeyStore | None]:
    """The key store a log is read with: an events file's `--keys FILE` (or `--keys-dsn DSN`); the topic's, the
    deployment's key store as the workers take it (`--keys-dsn` / KEEL_KEYS_DSN or `--keys FILE`), closed after."""
    topic = source.unit == "record" or getattr(args, "keys_dsn", None)
    keys = deployment_keys_of(args) if topic else keys_of(args)
    try:
        yield keys
    finally:
        close = getattr(keys, "close", None)        # the PostgreSQL store's connection (a key file has none)
        if callable(close):
            close()


def reveal_of(cartridge: Cartridge, keys: KeyStore | None, clear: bool = False) -> Callable[[bytes], bytes] | None:
    """How a log's envelopes are revealed for a cartridge: decrypted with `keys`; without them, a cartridge
    with personal fields refuses a sealed envelope saying that it needs the key file (docs/privacy.md); `clear`
    (`--clear`, an events file only) reads personal fields in clear (keel.connect.reveal_of)."""
    return connect.reveal_of(cartridge, keys, clear=clear)


def clear_of(args: argparse.Namespace, cartridges: list[Cartridge]) -> bool:
    """`--clear` of validate or diff: an events file's personal fields read in clear, after one warning; refused
    with --kafka (the topic never takes them in clear)."""
    if not getattr(args, "clear", None):
        return False
    if getattr(args, "from_kafka", None) is not None:
        raise UsageError(connect.CLEAR_ON_REDIS)
    connect.warn_clear(cartridges)
    return True


def validate_log(args: argparse.Namespace, cartridge: Cartridge, source: LogSource) -> int:
    """`keel validate CARTRIDGE (EVENTS | --kafka)`: every envelope of the log must parse, upcast and project
    under the cartridge (each Python upcaster called twice must agree); then the rules' checks."""
    clear = clear_of(args, [cartridge])
    with log_keys(args, source) as keys:
        build = LogBuild(cartridge, check_upcasters=True, reveal=reveal_of(cartridge, keys, clear))
        read = source.read([build])
    print_refusals(source, build)
    if build.refused:
        print(f"{source.name}: {len(build.refused)} bad {source.unit}(s) of {read}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{source.name}: {build.applied} events ok ({build.duplicates} duplicates ignored)")
    for line in unmet_rules(cartridge, build.store):
        print(f"{args.cartridge}: {line}")
    problems = stream_problems(cartridge, build.store, now_micros())
    for line in problems:
        print(f"{args.cartridge}: {line}", file=sys.stderr)
    return EXIT_USAGE if problems else EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """`keel diff OLD NEW (EVENTS | --events FILE | --kafka)`: exit 0 when no tenant's graph changes, 1 when some
    do (the report says how), 2 when the new cartridge refuses events the old one applies."""
    old, new = load_cartridge(args.old), load_cartridge(args.new)
    source = log_source(args, old)
    if source is None:
        raise UsageError("give the log to compare on: an events file (or --events FILE), or --kafka")
    clear = clear_of(args, [old, new])
    with log_keys(args, source) as keys:
        builds = [LogBuild(old, reveal=reveal_of(old, keys, clear)),
                  LogBuild(new, check_upcasters=True, reveal=reveal_of(new, keys, clear))]
        read = source.read(builds)
    report = compare(builds[0], builds[1], read)
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        print(printable(render(report)))
    refused_before = {r.where for r in builds[0].refused}
    for r in builds[1].refused:
        if r.where not in refused_before:
            print(printable(cut(source.where(f"{r} (refused by {args.new}, not by {args.old})"), 600)),
                  file=sys.stderr)
    if report.newly_refused:
        print(f"{args.new}: refuses {report.newly_refused} event(s) that {args.old} applies: a replay would "
              f"rebuild their tenants without them", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_DOMAIN if report.changed else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    """`keel schema CARTRIDGE [--event TYPE [--version N]] [--clear]`: JSON Schema (draft 2020-12) on stdout;
    personal fields sealed, as on the topic, or (`--clear`) as before sealing."""
    cartridge = load_cartridge(args.cartridge)
    if args.version is not None and args.event is None:
        raise UsageError("--version needs --event TYPE")
    clear = bool(getattr(args, "schema_clear", False))
    doc = cartridge_document(cartridge, clear=clear) if args.event is None else payload_document(
        cartridge, args.event, args.version, clear=clear)
    print(json.dumps(doc, ensure_ascii=False, indent=2))
    return EXIT_OK
