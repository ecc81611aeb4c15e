"""`keel cdc`: change data capture (entry point `cdc` of the group `keel.commands`, like `keel outbox`).

    keel cdc explain CARTRIDGE CHANGE.json     the envelopes a captured change becomes, or why none
    keel cdc relay CARTRIDGE --prefix P        Debezium's change topics P.<schema>.<table> -> keel.<cartridge>.events
    keel cdc status CARTRIDGE --prefix P       the relay's committed position and lag on every change topic

Configuration: flags, then KEEL_KAFKA_BOOTSTRAP from the environment.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from keel.cartridge import load_cartridge
from keel.commandline import key_store_arguments, positive_int
from keel.config import resolve
from keel.errors import DomainError, UsageError
from keel.health import add_probe_arguments
from keel.logs import add_log_arguments

EXIT_UNMAPPABLE = 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add `cdc explain`, `cdc relay` and `cdc status` to the `keel` parser."""
    kafka = argparse.ArgumentParser(add_help=False)
    kafka.add_argument("--kafka", metavar="BOOTSTRAP", help="Kafka bootstrap servers, comma-separated "
                       "(env KEEL_KAFKA_BOOTSTRAP, default 127.0.0.1:9092)")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("cartridge", help="cartridge folder (its `sources:` maps the captured tables)")
    where.add_argument("--prefix", required=True,
                       help="Debezium's topic.prefix: the change topics are <prefix>.<schema>.<table>")
    where.add_argument("--name", help="the relay's name; its consumer group is keel-cdc-<name> (default: the "
                                      "cartridge name)")
    cdc = sub.add_parser("cdc", help="change data capture: Debezium's change topics -> the cartridge's topic",
                         description="A product that has only a database: Debezium captures its tables' changes "
                                     "(PostgreSQL logical replication, in Kafka Connect); the cartridge's "
                                     "`sources:` maps them to its event types (docs/ingress.md).")
    verbs = cdc.add_subparsers(dest="cdc_command", metavar="VERB", parser_class=type(cdc))
    p = verbs.add_parser("explain", help="print the envelopes a captured change becomes (or why none)",
                         description="Read one Debezium change event (JSON, with or without the converter's "
                                     "embedded schema) and print the envelopes the cartridge's `sources:` make of "
                                     "it, one JSON line each, personal fields in clear (nothing is sealed or "
                                     "sent). Exit 0 with envelopes or a change that maps to nothing (the reason "
                                     "on stderr), 1 when it cannot map (what the relay dead-letters), 2 on a bad "
                                     "cartridge or file.")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("change", help="a file holding one change event as JSON ('-': standard input)")
    p.set_defaults(run=cmd_explain)
    keys = key_store_arguments("a cartridge with personal fields: the PostgreSQL key store they are sealed with")
    p = verbs.add_parser("relay", parents=[where, kafka, keys], help="relay the change topics to the events topic",
                         description="Consume the change topics of the tables the cartridge maps (a consumer group "
                                     "keel-cdc-<name>, offsets committed once Kafka acknowledged the envelopes "
                                     "made of them), map each change, produce its envelopes (acks=all, key = "
                                     "tenant; ids from the change's position, so a change read twice is the same "
                                     "envelope), and dead-letter a change that cannot map with the reason and its "
                                     "position. Personal fields are sealed with the key store. Runs until "
                                     "SIGTERM/SIGINT.")
    p.add_argument("--partitions", type=positive_int, default=8,
                   help="partitions of the events and dead-letter topics when created (default 8)")
    p.add_argument("--replication-factor", type=positive_int, default=1,
                   help="replication factor of topics created when missing (default 1)")
    p.add_argument("--once", action="store_true", help="relay what the change topics hold now, then exit")
    p.add_argument("--batch", type=positive_int, default=2000, help="change records per step (default 2000)")
    p.add_argument("--progress", type=float, default=10.0, metavar="SECONDS", help="progress line period (default 10)")
    add_log_arguments(p)
    add_probe_arguments(p)
    p.set_defaults(run=cmd_relay)
    status = argparse.ArgumentParser(add_help=False)
    status.add_argument("cartridge", help="cartridge folder (its `sources:` maps the captured tables)")
    status.add_argument("--prefix", help="Debezium's topic.prefix: also list the mapped tables' change topics the "
                                         "relay has no position on yet (default: the partitions it committed)")
    status.add_argument("--name", help="the relay's name (default: the cartridge name)")
    p = verbs.add_parser("status", parents=[status, kafka], help="the relay's position and lag on the change topics",
                         description="The relay's committed offset on every change topic partition it relays, the "
                                     "partition's end, and the lag between them (exit 3 when Kafka cannot be "
                                     "read). `keel status` shows the same for a cartridge with `sources:`.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=cmd_status)
    cdc.set_defaults(run=lambda args: _usage(cdc))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_explain(args: argparse.Namespace) -> int:
    from .cdc import ChangeEncoder
    cartridge = load_cartridge(args.cartridge)
    if not cartridge.spec.sources:
        raise UsageError(f"{args.cartridge}: the cartridge has no `sources:` (docs/ingress.md says how to map a "
                         "captured table)")
    try:
        text = sys.stdin.buffer.read() if args.change == "-" else Path(args.change).read_bytes()
    except OSError as e:
        raise UsageError(f"{args.change}: cannot be read: {e.strerror or e}") from None
    envelopes, reason = ChangeEncoder(cartridge, None).explain(text)
    for envelope in envelopes:
        print(json.dumps(envelope, ensure_ascii=False, sort_keys=True))
    if reason is not None:
        print(reason, file=sys.stderr)
        return EXIT_UNMAPPABLE if reason.startswith("cannot map") else 0
    return 0


def cmd_relay(args: argparse.Namespace) -> int:
    from .cdc import CdcOptions, ChangeSource, change_topics, relay_changes
    from .cli import process_options, sealing_of
    from .producer import KafkaSink, TopicSpec
    from .run import process_log, process_probes, stop_on_signals

    cartridge = load_cartridge(args.cartridge)
    topics = change_topics(cartridge, args.prefix)
    if not topics:
        raise UsageError(f"{args.cartridge}: the cartridge has no `sources:`; nothing to relay")
    if args.progress <= 0:
        raise UsageError("--progress must be positive")
    options = CdcOptions(prefix=args.prefix, name=args.name or cartridge.name, batch=args.batch,
                         progress_s=args.progress, once=args.once)
    settings = resolve(vars(args))
    sealing = sealing_of(cartridge, settings)
    process = process_options(args)
    log = process_log("keel.cdc")

    async def main() -> None:
        with process_probes(process, log) as probes:
            stop = asyncio.Event()
            stop_on_signals(stop, log)
            await relay_changes(cartridge, ChangeSource(settings.kafka_bootstrap, topics, options.group),
                                KafkaSink(settings.kafka_bootstrap, client_id="keel-cdc"), options, log, stop,
                                topics=TopicSpec(args.partitions, args.replication_factor), probes=probes,
                                sealing=sealing)
    asyncio.run(main())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .cdc import change_topics
    from .cdc_status import position_doc, relay_group, relay_position, render_position
    cartridge = load_cartridge(args.cartridge)
    topics = change_topics(cartridge, args.prefix) if args.prefix else None
    if not cartridge.spec.sources:
        raise DomainError(f"{args.cartridge}: the cartridge has no `sources:`")
    settings = resolve(vars(args))
    group = relay_group(args.name or cartridge.name)
    doc = position_doc(group, asyncio.run(relay_position(settings.kafka_bootstrap, topics, group)), topics)
    print(json.dumps(doc, sort_keys=True) if args.json else "\n".join(render_position(doc)))
    return 0
