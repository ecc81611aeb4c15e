"""Subcommands this package adds to `keel` (entry point `ingress` of the group `keel.commands`, as `workers` and
`tools_server` add theirs): `outbox init`, `outbox relay`, `webhook`. They run as `keel outbox relay ...` (or
`python -m keel.cli outbox relay ...`); like every plug-in this module never imports keel.cli, the floor above it.

Configuration: flags, then KEEL_POSTGRES_DSN / KEEL_KAFKA_BOOTSTRAP from the environment.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keel.cartridge import load_cartridge
from keel.commandline import key_store_arguments, positive_int
from keel.config import resolve
from keel.errors import UsageError
from keel.health import add_probe_arguments, metrics_port
from keel.logs import add_log_arguments, log_format, setup_logging

from . import DEFAULT_TABLE

if TYPE_CHECKING:
    from keel.cartridge import Cartridge
    from keel.config import Settings

    from .outbox import OutboxTables
    from .sealing import IngressSealing


def register(sub: argparse._SubParsersAction) -> None:
    """Add `outbox init`, `outbox relay` and `webhook` to the `keel` parser."""
    kafka = argparse.ArgumentParser(add_help=False)
    kafka.add_argument("--kafka", metavar="BOOTSTRAP", help="Kafka bootstrap servers, comma-separated "
                       "(env KEEL_KAFKA_BOOTSTRAP, default 127.0.0.1:9092)")
    kafka.add_argument("--partitions", type=positive_int, default=8,
                       help="partitions of topics created when missing (default 8)")
    kafka.add_argument("--replication-factor", type=positive_int, default=1,
                       help="replication factor of topics created when missing (default 1)")
    keys = key_store_arguments("a cartridge with personal fields: the PostgreSQL key store they are sealed with")
    table = argparse.ArgumentParser(add_help=False)
    table.add_argument("--dsn", help="PostgreSQL connection string (env KEEL_POSTGRES_DSN)")
    table.add_argument("--schema", help="schema of the outbox tables (default: the search_path)")
    table.add_argument("--table", default=DEFAULT_TABLE,
                       help=f"outbox table; its cursor table is <table>_cursor (default {DEFAULT_TABLE})")

    outbox = sub.add_parser("outbox", help="transactional outbox in PostgreSQL -> the cartridge's topic",
                            description="A product inserts envelopes into an outbox table in the same transaction "
                                        "as its business change; the relay publishes them.")
    verbs = outbox.add_subparsers(dest="outbox_command", metavar="VERB", parser_class=type(outbox))
    p = verbs.add_parser("init", parents=[table], help="create the outbox and cursor tables (idempotent)",
                         description="Create <table> (position bigserial, envelope jsonb, xid xid8 default "
                                     "pg_current_xact_id(), created_at) and <table>_cursor when missing.")
    p.set_defaults(run=cmd_outbox_init)
    p = verbs.add_parser("relay", parents=[table, kafka, keys], help="publish the outbox to keel.<cartridge>.events",
                         description="Tail the outbox in (xid, position) order, never past a transaction that "
                                     "can still commit; produce valid envelopes (acks=all, key = tenant), invalid "
                                     "ones to keel.<cartridge>.dlq with the reason; store the cursor after Kafka "
                                     "acknowledges. At least once. Runs until SIGTERM/SIGINT. A cartridge's "
                                     "personal fields are sealed with the key store before they are produced.")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("--name", help="relay (cursor) name (default: the cartridge name)")
    p.add_argument("--once", action="store_true", help="relay what is relayable now, then exit")
    p.add_argument("--batch", type=positive_int, default=2000, help="rows per step (default 2000)")
    p.add_argument("--interval", type=float, default=0.2, metavar="SECONDS",
                   help="wait between polls when idle (default 0.2)")
    p.add_argument("--xmin-warn", type=float, default=30.0, metavar="SECONDS",
                   help="log when committed rows wait this long behind one open transaction (default 30)")
    p.add_argument("--progress", type=float, default=10.0, metavar="SECONDS", help="progress line period (default 10)")
    p.add_argument("--prune", action="store_true",
                   help="delete rows once every relay of the table has relayed them")
    add_log_arguments(p)
    add_probe_arguments(p)
    p.set_defaults(run=cmd_outbox_relay)
    outbox.set_defaults(run=lambda args: _usage(outbox))

    p = sub.add_parser("webhook", parents=[kafka, keys], help="signed HTTP ingress -> keel.<cartridge>.events",
                       description="POST /events/<cartridge> one envelope or JSON lines, signed per tenant with "
                                   "X-Keel-Tenant and X-Keel-Signature: sha256=<hex HMAC-SHA256 of the body>. "
                                   "Answers 202 with accepted ids and per-event rejections, 400, 401, 413, 503. "
                                   "A cartridge's personal fields are sealed with the key store before they are "
                                   "produced.")
    p.add_argument("cartridges", nargs="+", metavar="cartridge", help="cartridge folder(s)")
    p.add_argument("--port", type=int, required=True, help="TCP port (0: any free port, logged)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--secrets", metavar="FILE",
                   help="YAML/JSON mapping tenant -> secret (or a list of secrets); SIGHUP reloads it (needed "
                        "unless --issuer is given)")
    p.add_argument("--issuer", action="append", metavar="URL",
                   help="also accept OAuth bearer tokens of this authorization server (repeatable; env "
                        "KEEL_OAUTH_ISSUER): the tenant comes from the token's tenant claim, keel:write is needed")
    p.add_argument("--resource", metavar="URL",
                   help="with --issuer: this server's public URL, the audience tokens must name (env "
                        "KEEL_OAUTH_RESOURCE; default http://HOST:PORT/events)")
    p.add_argument("--max-body", type=positive_int, default=1 << 20, metavar="BYTES",
                   help="largest request body (default 1048576)")
    p.add_argument("--max-batch", type=positive_int, default=1000, metavar="N",
                   help="most envelopes per request (default 1000)")
    p.add_argument("--kafka-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="answer 503 when Kafka has not acknowledged a request's events within this (default 5)")
    p.add_argument("--progress", type=float, default=10.0, metavar="SECONDS", help="counters line period (default 10)")
    add_log_arguments(p)
    add_probe_arguments(p)
    p.set_defaults(run=cmd_webhook)




def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def dsn_of(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("KEEL_POSTGRES_DSN")
    if not dsn:
        raise UsageError("give --dsn or set KEEL_POSTGRES_DSN (e.g. postgresql://user@127.0.0.1:5432/app)")
    return dsn


def tables_of(args: argparse.Namespace) -> OutboxTables:
    from .outbox import OutboxTables  # psycopg is imported only by the commands that need it
    return OutboxTables(table=args.table, schema=args.schema)


def process_options(args: argparse.Namespace):  # -> run.ProcessOptions (imported lazily)
    """Logging set up once for the process (--log-format), and its probe options."""
    from .run import ProcessOptions
    options = ProcessOptions(log_format(args.log_format), metrics_port(args.metrics_port), args.stall_after)
    setup_logging(options.log_format)
    return options


def cmd_outbox_init(args: argparse.Namespace) -> int:
    from .outbox import init_outbox
    tables = tables_of(args)
    problems = init_outbox(dsn_of(args), tables)
    for problem in problems:
        print(f"keel: {problem}", file=sys.stderr)
    if problems:
        print(f"keel: {tables} exists with another shape; the relay needs the columns above", file=sys.stderr)
        return 2
    prefix = f"{tables.schema}." if tables.schema else ""
    print(f"outbox ready: {tables} and {prefix}{tables.cursor_table}")
    return 0


def cmd_outbox_relay(args: argparse.Namespace) -> int:
    from .producer import TopicSpec
    from .relay import RelayOptions
    from .run import process_log, relay_main

    cartridge = load_cartridge(args.cartridge)
    if args.interval <= 0 or args.xmin_warn <= 0 or args.progress <= 0:
        raise UsageError("--interval, --xmin-warn and --progress must be positive")
    options = RelayOptions(name=args.name or cartridge.name, batch=args.batch, interval_s=args.interval,
                           xmin_warn_s=args.xmin_warn, progress_s=args.progress, prune=args.prune, once=args.once)
    settings = resolve(vars(args))
    sealing = sealing_of(cartridge, settings)
    process = process_options(args)
    log = process_log("keel.relay")
    asyncio.run(relay_main(cartridge, dsn_of(args), tables_of(args), settings.kafka_bootstrap, options,
                           TopicSpec(args.partitions, args.replication_factor), log, process, sealing))
    return 0


def sealing_of(cartridge: Cartridge, settings: Settings) -> IngressSealing:
    """How the ingress seals a cartridge's personal fields: with the key store of the settings (a usage error
    when the cartridge declares personal fields and none is given)."""
    from keel.keystore_pg import privacy_of  # psycopg is imported only by the commands that need it

    from .sealing import IngressSealing
    return IngressSealing(privacy_of(cartridge, settings, create=True))


def cmd_webhook(args: argparse.Namespace) -> int:
    from keel.oauth import JwtVerifier, oauth_settings

    from .producer import TopicSpec
    from .run import NoSecrets, SecretsFile, process_log, webhook_main
    from .webhook import Limits

    cartridges = [load_cartridge(path) for path in args.cartridges]
    names = [c.name for c in cartridges]
    if len(set(names)) != len(names):
        raise UsageError(f"two cartridge folders have the same name: {', '.join(sorted(names))}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: not a TCP port")
    oauth = oauth_settings(args.issuer, args.resource, host=args.host, port=args.port, path="/events")
    if args.secrets is None and oauth is None:
        raise UsageError("give --secrets FILE (signed requests) or --issuer URL (OAuth bearer tokens), or both")
    settings = resolve(vars(args))
    sealing = {c.name: sealing_of(c, settings) for c in cartridges}
    process = process_options(args)
    log = process_log("keel.webhook")
    secrets = SecretsFile(Path(args.secrets), log) if args.secrets else NoSecrets()
    return asyncio.run(webhook_main(cartridges, secrets, args.host, args.port, settings.kafka_bootstrap,
                                    Limits(args.max_body, args.max_batch, args.kafka_timeout),
                                    TopicSpec(args.partitions, args.replication_factor), log, args.progress,
                                    process, oauth=JwtVerifier(oauth) if oauth is not None else None,
                                    sealing=sealing))
