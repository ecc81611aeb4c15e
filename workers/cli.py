"""Subcommands this package adds to `keel` (entry point `workers` of the group `keel.commands`): publish, worker, status,
replay, archive.

Heavy imports (faust, aiokafka, redis) happen inside the commands, so `keel --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from keel.commandline import add_events_arguments, events_of, key_store_arguments, positive_int, settings_of
from keel.health import add_probe_arguments
from keel.logs import add_log_arguments, log_format, setup_logging

if TYPE_CHECKING:
    from .dlq_commands import Filter

LOG_LEVELS = ("crit", "error", "warn", "info", "debug")


def register(sub: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the `keel` parser."""
    kafka = argparse.ArgumentParser(add_help=False)
    kafka.add_argument("--kafka", metavar="BOOTSTRAP", help="Kafka bootstrap servers, comma-separated "
                       "(env KEEL_KAFKA_BOOTSTRAP, default 127.0.0.1:9092)")
    topics = argparse.ArgumentParser(add_help=False)
    topics.add_argument("--partitions", type=positive_int, default=8,
                        help="partitions of topics created when missing (default 8)")
    topics.add_argument("--replication-factor", type=positive_int, default=1,
                        help="replication factor of topics created when missing (default 1)")
    redis = argparse.ArgumentParser(add_help=False)
    redis.add_argument("--redis", metavar="URL", help="Redis URL, redis://host:port/db (env KEEL_REDIS_URL)")
    keys = key_store_arguments()
    cold = argparse.ArgumentParser(add_help=False)
    cold.add_argument("--cold-dsn", metavar="DSN", help="the cold tier: PostgreSQL holding the closed "
                      "history (env KEEL_COLD_DSN; docs/operations.md, \"Cold tier\"). Default: none")

    p = sub.add_parser("publish", parents=[kafka, topics, keys], help="send an events file to the cartridge's topic",
                       description="Check each line of an events file with the cartridge's catalog and send "
                                   "each valid envelope (canonical form, as file mode reads it) to "
                                   "keel.<cartridge>.events keyed by tenant, acks=all. Bad lines are reported "
                                   "with their line numbers and not sent. Exit 0 when every line was sent, "
                                   "2 when some were rejected (the valid ones are sent).")
    p.add_argument("cartridge", help="cartridge folder")
    add_events_arguments(p, "JSONL events file")
    p.add_argument("--recorded-at", choices=("occurred", "now"), default="occurred",
                   help="recorded_at of envelopes without one: occurred_at, as file mode does (default), or the "
                        "time of publishing (for fixed dead letters and late data: knowledge is not backdated)")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary")
    p.set_defaults(run=cmd_publish)

    p = sub.add_parser("worker", parents=[kafka, redis, topics, keys, cold], help="run the stream worker of one or more cartridges",
                       description="Consume keel.<cartridge>.events (consumer group keel.<cartridge>.worker), apply "
                                   "the cartridge's handlers and write each batch to Redis atomically per tenant "
                                   "with the tenant's applied offset; rejected records go to keel.<cartridge>.dlq. "
                                   "Runs until SIGTERM/SIGINT (the in-flight batch is finished first).")
    p.add_argument("cartridges", nargs="+", metavar="cartridge",
                   help="cartridge folder(s), separated by spaces or commas")
    p.add_argument("--batch", type=positive_int, help="records per batch (default 20000)")
    p.add_argument("--within", type=float, default=0.5, metavar="SECONDS",
                   help="how long a fetch waits to fill a batch (default 0.5)")
    p.add_argument("--max-mirrored-tenants", type=positive_int, default=100_000,
                   help="tenants kept in the in-process mirror (least recently used are dropped; default 100000)")
    p.add_argument("--allow-global-notes", action="store_true", default=None,
                   help="apply global-scope notes (env KEEL_ALLOW_GLOBAL_NOTES)")
    p.add_argument("--unready-after", type=float, default=30.0, metavar="SECONDS",
                   help="/readyz answers 503, naming the cause (Redis refusing writes, read-only or unreachable; "
                        "Kafka unreachable), when no batch was committed and the partitions were not found caught "
                        "up for this long (default 30)")
    p.add_argument("-l", "--log-level", "--loglevel", dest="loglevel", choices=LOG_LEVELS, default="info",
                   help="log level (default info); debug also opens the client libraries' loggers (aiokafka, "
                        "redis, …), which sit at WARNING otherwise")
    p.add_argument("--quiet", action="store_true", help="no startup banner")
    add_log_arguments(p)
    add_probe_arguments(p)
    p.set_defaults(run=cmd_worker)

    p = sub.add_parser("status", parents=[kafka, redis, cold], help="lag, owners, offsets and dead letters of a cartridge's workers",
                       description="Per partition: log end, the worker group's committed offset, lag, owner (group "
                                   "member) and last commit; the group's members; per tenant (from Redis): the "
                                   "applied offset; dead letters of every writer (open, total, last hour); problems "
                                   "in plain words. Exit 0, or 3 when Kafka or Redis could not be read (what could "
                                   "be read is still printed).")
    p.add_argument("cartridge", help="cartridge folder, or several separated by commas (a report each; --json: "
                                     "{cartridge: report})")
    p.add_argument("--tenant", help="only this tenant's applied offsets")
    p.add_argument("--stalled-after", type=float, default=60.0, metavar="SECONDS",
                   help="a partition with lag whose owner has not committed for this long is reported stalled "
                        "(default 60)")
    p.add_argument("--json", action="store_true",
                   help="print {lag, members, partitions, tenants, dead_letters, problems, unavailable} as JSON")
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("dlq", parents=[kafka], help="list, show, redrive and close a cartridge's dead letters",
                       description="Dead letters of keel.<cartridge>.dlq, whoever wrote them (workers, relay, "
                                   "webhook). A letter is named <partition>:<offset>. redrive re-sends the letters "
                                   "the cartridge now accepts with recorded_at = now and closes them.")
    dsub = p.add_subparsers(dest="dlq_command", required=True, metavar="{list,show,redrive,close}",
                            parser_class=type(p))
    select = argparse.ArgumentParser(add_help=False)
    select.add_argument("cartridge", help="cartridge folder")
    select.add_argument("--tenant", help="only this tenant's letters")
    select.add_argument("--reason", help="only letters whose reason contains this text (any case)")
    select.add_argument("--since", metavar="TIME", help="only letters dead-lettered at or after TIME")
    select.add_argument("--until", metavar="TIME", help="only letters dead-lettered at or before TIME")
    q = dsub.add_parser("list", parents=[kafka, select], help="one line per open dead letter")
    q.add_argument("--all", action="store_true", help="include letters already redriven")
    q.add_argument("--json", action="store_true", help="one JSON object per line")
    q.set_defaults(run=cmd_dlq_list)
    q = dsub.add_parser("show", parents=[kafka], help="a dead letter in full: headers, key and value")
    q.add_argument("cartridge", help="cartridge folder")
    q.add_argument("ref", nargs="+", metavar="PARTITION:OFFSET")
    q.set_defaults(run=cmd_dlq_show)
    q = dsub.add_parser("redrive", parents=[kafka, select], help="send open letters again, recorded_at = now",
                        description="Re-send the selected open letters that the cartridge now accepts, with "
                                    "recorded_at = the time of the redrive and header keel.redrive.of, then mark "
                                    "them redriven. Exit 0 when every selected letter was sent, 2 when some are "
                                    "still rejected (they stay open).")
    q.add_argument("--ref", action="append", default=[], metavar="PARTITION:OFFSET", help="only these (repeatable)")
    q.add_argument("--dry-run", action="store_true", help="say what would be sent, send nothing")
    q.set_defaults(run=cmd_dlq_redrive)
    q = dsub.add_parser("close", parents=[kafka, select], help="close open letters dealt with by hand (sends nothing)",
                        description="Mark the selected open letters as dealt with (e.g. the fixed envelope was sent "
                                    "with `keel publish --recorded-at now`): they no longer count as open.")
    q.add_argument("--ref", action="append", default=[], metavar="PARTITION:OFFSET", help="only these (repeatable)")
    q.set_defaults(run=cmd_dlq_close)

    p = sub.add_parser("replay", parents=[kafka, redis, keys, cold], help="rebuild tenants from the topic, no downtime",
                       description="Rebuild a tenant (or every tenant) from its partition of keel.<cartridge>.events "
                                   "into a shadow generation while live ingestion continues, cut over atomically "
                                   "once caught up, then delete the old generation. Interrupted, the served graph "
                                   "is untouched and a rerun completes.")
    p.add_argument("cartridge", help="cartridge folder, or several separated by commas (replayed in turn)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tenant", action="append", help="tenant to rebuild (repeatable)")
    which.add_argument("--all", action="store_true", help="every tenant keyed in the topic")
    p.add_argument("--batch", type=positive_int, default=5000,
                   help="events per step loaded into the shadow, one MULTI/EXEC (default 5000)")
    p.add_argument("--allow-global-notes", action="store_true", default=None,
                   help="as the worker runs (env KEEL_ALLOW_GLOBAL_NOTES): judge global notes the same way")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary")
    add_log_arguments(p)
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("archive", parents=[redis, cold], help="move old closed history to the cold tier (PostgreSQL)",
                       description="Move the closed segments of a namespace whose newest valid time is "
                                   "older than cold_after (cartridge.yaml `history: {cold_after: 90d}`, or the "
                                   "namespace's --set-cold-after), and with --budget the oldest others while Redis "
                                   "uses more memory than that, from Redis to the cold tier. Each segment is copied "
                                   "(an idempotent upsert) then deleted from Redis if unchanged: killed at any "
                                   "point, a rerun completes. Reads fetch cold pieces by themselves. Loops every "
                                   "--interval (PostgreSQL or Redis down: it waits and resumes) until SIGTERM; "
                                   "--once makes one pass. Exit 0; 2 for a namespace in an old layout or no cold tier; "
                                   "3 when --once met an outage.")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS", help="between passes (default 60)")
    p.add_argument("--batch", type=positive_int, default=200,
                   help="segments per PostgreSQL transaction and Redis round trip (default 200)")
    p.add_argument("--budget", metavar="BYTES", help="Redis used_memory past which the namespace's oldest closed "
                   "segments move too, whatever their age (e.g. 8GB, 500MB; default: none)")
    p.add_argument("--set-cold-after", metavar="DURATION", help="set the namespace's cold_after (e.g. 30d, or "
                   "never) over the cartridge's, in Redis, and exit")
    p.add_argument("--reset-cold-after", action="store_true", help="go back to the cartridge's cold_after, and exit")
    p.add_argument("--keep-chunks", type=positive_int, default=None, metavar="N",
                   help="the newest change-log chunks of each tenant that stay in Redis (a chunk is one commit "
                        "step's writes, at most 256; default 256): pages of them never read PostgreSQL")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary")
    add_log_arguments(p)
    p.set_defaults(run=cmd_archive)

    erase = sub.choices.get("erase")        # keel erase (keel/privacy_commands.py): add its Redis/Kafka mode
    if erase is not None:
        erase.add_argument("--redis", metavar="URL", help="Redis/Kafka mode: the Redis graph, whose tenant T is "
                           "rebuilt from the log after the keys are deleted")
        erase.add_argument("--kafka", metavar="BOOTSTRAP", help="Redis/Kafka mode: where the receipt is produced "
                           "(env KEEL_KAFKA_BOOTSTRAP)")
        erase.add_argument("--cold-dsn", metavar="DSN", help="Redis/Kafka mode: the cold tier (env KEEL_COLD_DSN), "
                           "whose rows of the tenant go with its Redis keys")
        erase.add_argument("--keys-dsn", metavar="DSN", help="Redis/Kafka mode: the PostgreSQL key store (env "
                           "KEEL_KEYS_DSN), or --keys FILE")
        erase.set_defaults(run=cmd_erase, embedded_erase=erase.get_default("run"))
    offboard = sub.choices.get("offboard")  # keel offboard (keel/privacy_commands.py): its Redis/Kafka mode
    if offboard is not None:
        offboard.add_argument("--redis", metavar="URL", help="Redis/Kafka mode: the Redis graph, where every key "
                              "of T is dropped and T is recorded as offboarded")
        offboard.add_argument("--kafka", metavar="BOOTSTRAP", help="Redis/Kafka mode: where the receipt is produced "
                              "(env KEEL_KAFKA_BOOTSTRAP)")
        offboard.add_argument("--cold-dsn", metavar="DSN", help="Redis/Kafka mode: the cold tier (env KEEL_COLD_DSN), "
                           "whose rows of the tenant go with its Redis keys")
        offboard.add_argument("--keys-dsn", metavar="DSN", help="Redis/Kafka mode: the PostgreSQL key store (env "
                              "KEEL_KEYS_DSN), or --keys FILE")
        offboard.set_defaults(run=cmd_offboard, embedded_offboard=offboard.get_default("run"))



# ---- commands --------------------------------------------------------------------------------

def cmd_publish(args: argparse.Namespace) -> int:
    from keel.cartridge import load_cartridge
    from keel.embedded import print_reject
    from keel.errors import UsageError
    from keel.kafka import TopicSpec
    from keel.keystore_pg import privacy_of

    from .publish import publish_file

    cartridge = load_cartridge(args.cartridge)
    events = events_of(args)
    if events is None:
        raise UsageError("give the events file to publish: keel publish <cartridge> <events> (or --events FILE)")
    try:
        open(events, "rb").close()
    except OSError as e:
        raise UsageError(f"events file {events}: {e.strerror}") from None
    settings = settings_of(args)
    privacy = privacy_of(cartridge, settings, create=True)     # personal fields are sealed before they are sent
    progress = None if args.quiet or not sys.stderr.isatty() else _progress_printer()
    report = publish_file(cartridge, events, settings.kafka_bootstrap,
                          topics=TopicSpec(args.partitions, args.replication_factor),
                          on_reject=print_reject(events), progress=progress,
                          recorded_now=args.recorded_at == "now", privacy=privacy)
    if progress is not None:
        print(file=sys.stderr)
    if not args.quiet:
        print(report.summary())
    return 2 if report.rejected else 0


def _progress_printer() -> Callable[[int, int], None]:
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.2 or done == total:
            last[0] = now
            print(f"\rpublishing: {done}/{total} acknowledged", end="", file=sys.stderr, flush=True)
    return show


def cmd_worker(args: argparse.Namespace) -> int:
    from keel.cartridge_set import load_cartridges
    from keel.errors import UsageError
    from keel.health import metrics_port
    from keel.kafka import TopicSpec
    from keel.keystore_pg import require_key_store

    from .app import ProcessOptions, run_worker
    from .ingest import DEFAULT_BATCH, WorkerOptions

    cartridges = load_cartridges(args.cartridges)
    settings = settings_of(args)
    if not settings.redis_url:
        raise UsageError("the worker writes to Redis: pass --redis URL or set KEEL_REDIS_URL")
    require_key_store(cartridges, settings)
    options = WorkerOptions(batch=args.batch or DEFAULT_BATCH, within_s=args.within,
                            topics=TopicSpec(args.partitions, args.replication_factor),
                            max_mirrored_tenants=args.max_mirrored_tenants, unready_after_s=args.unready_after)
    process = ProcessOptions(loglevel=args.loglevel, quiet=args.quiet, log_format=log_format(args.log_format),
                             metrics_port=metrics_port(args.metrics_port), stall_after_s=args.stall_after)
    return run_worker(cartridges, settings, options, process)


def cmd_status(args: argparse.Namespace) -> int:
    from keel.cartridge_set import load_cartridges

    from .status import EXIT_PARTIAL, gather_status, render_status

    cartridges = load_cartridges(args.cartridge)
    settings = settings_of(args)
    docs = {c.name: gather_status(c, settings, tenant=args.tenant, stalled_after=args.stalled_after)
            for c in cartridges}
    if len(docs) == 1:
        [doc] = docs.values()
        print(json.dumps(doc, indent=2) if args.json else render_status(doc))
    elif args.json:                            # several cartridges: one document each, by name
        print(json.dumps(docs, indent=2))
    else:
        print("\n\n".join(f"== {name} ==\n{render_status(doc)}" for name, doc in docs.items()))
    return EXIT_PARTIAL if any(doc["unavailable"] for doc in docs.values()) else 0


def _dlq_filter(args: argparse.Namespace, refs: list[str] | None = None) -> Filter:
    from .dlq_commands import Filter
    return Filter.of(args.tenant, args.reason, args.since, args.until, refs or [],
                     include_redriven=getattr(args, "all", False))


def cmd_dlq_list(args: argparse.Namespace) -> int:
    from keel.cartridge import load_cartridge

    from .dlq_commands import letter_doc, load, render_list

    dead = load(load_cartridge(args.cartridge), settings_of(args).kafka_bootstrap)
    letters = _dlq_filter(args).select(dead)
    if args.json:
        for x in letters:
            print(json.dumps(letter_doc(x, dead), ensure_ascii=False))
    else:
        print(render_list(letters, dead))
    return 0


def cmd_dlq_show(args: argparse.Namespace) -> int:
    from keel.cartridge import load_cartridge
    from keel.errors import UsageError

    from .dlq_commands import Filter, letter_doc, load

    dead = load(load_cartridge(args.cartridge), settings_of(args).kafka_bootstrap)
    letters = Filter.of(None, None, None, None, args.ref, include_redriven=True).select(dead)
    missing = set(args.ref) - {x.ref for x in letters}
    if missing:
        raise UsageError(f"no dead letter {', '.join(sorted(missing))} (`keel dlq list --all` names them)")
    for x in letters:
        print(json.dumps(letter_doc(x, dead, value=True), indent=2, ensure_ascii=False))
    return 0


def cmd_dlq_redrive(args: argparse.Namespace) -> int:
    from keel.cartridge import load_cartridge

    from .dlq_commands import redrive

    report = redrive(load_cartridge(args.cartridge), settings_of(args).kafka_bootstrap,
                     _dlq_filter(args, args.ref), dry_run=args.dry_run)
    print(("(dry run) " if args.dry_run else "") + report.summary())
    return 2 if report.refused else 0


def cmd_replay(args: argparse.Namespace) -> int:
    from keel.cartridge_set import load_cartridges

    from .replay import ReplayOptions, replay
    from .replay_progress import Progress

    setup_logging(log_format(args.log_format))      # its warnings in the format every other process uses
    cartridges = load_cartridges(args.cartridge)
    for cartridge in cartridges:                    # each from its own topic into its own namespace, in turn
        progress = Progress(f"replay {cartridge.name}", quiet=args.quiet)
        report = replay(cartridge, settings_of(args), tenants=None if args.all else list(dict.fromkeys(args.tenant)),
                        options=ReplayOptions(batch=args.batch), progress=progress)
        if not args.quiet:
            print(report.summary() if len(cartridges) == 1 else f"{cartridge.name}: {report.summary()}")
    return 0


def _bytes(text: str) -> int:
    """`8GB`, `500MB`, `64KB` or a number of bytes."""
    from keel.errors import UsageError
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "B": 1}
    t = text.strip().upper()
    for unit, size in units.items():
        if t.endswith(unit) and t[:-len(unit)].strip().isdigit():
            return int(t[:-len(unit)]) * size
    if t.isdigit():
        return int(t)
    raise UsageError(f"--budget {text!r}: use bytes or a size such as 500MB or 8GB")


def cmd_archive(args: argparse.Namespace) -> int:
    from keel.cartridge import load_cartridge
    from keel.errors import UsageError

    from .archive import ArchiveOptions, archive, open_with_cold_tier, policy, set_policy

    setup_logging(log_format(args.log_format))
    cartridge = load_cartridge(args.cartridge)
    settings = settings_of(args)
    if args.set_cold_after is not None or args.reset_cold_after:
        if args.set_cold_after is not None and args.reset_cold_after:
            raise UsageError("give --set-cold-after or --reset-cold-after, not both")
        store = open_with_cold_tier(cartridge, settings)
        try:
            try:
                set_policy(store, None if args.reset_cold_after else args.set_cold_after)
            except ValueError as e:
                raise UsageError(f"--set-cold-after: {e}") from None
            print(f"{cartridge.name}: cold_after {policy(cartridge, store)[0]}")
        finally:
            store.close()
        return 0
    options = ArchiveOptions(once=args.once, interval_s=args.interval, batch=args.batch,
                             budget=None if args.budget is None else _bytes(args.budget),
                             quiet=args.quiet, **({"keep_chunks": args.keep_chunks} if args.keep_chunks else {}))
    report = archive(cartridge, settings, options)
    if not args.quiet:
        print(report.summary())
    return 0


def cmd_dlq_close(args: argparse.Namespace) -> int:
    from keel.cartridge import load_cartridge

    from .dlq_commands import close

    refs = close(load_cartridge(args.cartridge), settings_of(args).kafka_bootstrap, _dlq_filter(args, args.ref))
    print(f"closed {len(refs)} dead letter(s)" + (f": {', '.join(refs)}" if refs else ""))
    return 0


def _stream_mode(args: argparse.Namespace) -> None:
    """`keel erase|offboard --redis`: the log is the cartridge's topic (no --events); logging set up once."""
    from keel.errors import UsageError
    if args.events:
        raise UsageError("--events is embedded mode; with --redis the log is the cartridge's topic")
    setup_logging(log_format(None))


def cmd_offboard(args: argparse.Namespace) -> int:
    """`keel offboard`: embedded mode (keel/privacy_commands.py) unless --redis is given (workers/offboard.py)."""
    if not args.redis:
        return args.embedded_offboard(args)
    from keel.cartridge import load_cartridge

    from .offboard import offboard_in_stream

    _stream_mode(args)
    print(offboard_in_stream(load_cartridge(args.cartridge), settings_of(args), args.tenant, args.reason).summary())
    return 0


def cmd_erase(args: argparse.Namespace) -> int:
    """`keel erase`: embedded mode (keel/privacy_commands.py) unless --redis is given."""
    if not args.redis:
        return args.embedded_erase(args)
    from keel.cartridge import load_cartridge
    from keel.errors import EXIT_DOMAIN

    from .erase import erase_in_stream
    from .replay_progress import Progress

    _stream_mode(args)
    cartridge = load_cartridge(args.cartridge)
    report = erase_in_stream(cartridge, settings_of(args), args.tenant, args.subject, args.reason,
                             progress=Progress(f"erase {cartridge.name}", quiet=True))
    if report is None:
        print(f"keel: the key store never held a key of {args.subject} in tenant {args.tenant}: nothing to erase",
              file=sys.stderr)
        return EXIT_DOMAIN
    print(report.summary())
    return 0
