"""`keel` command line: the entry point, with the query commands of the five tools (context, history, search,
related, annotate) over an events file or Redis, `validate`, `digest` and `demo`. Exit codes (EXIT_* in keel.errors): 0 ok, 1 domain
error, 2 usage or validation error, 3 a service is unavailable (Kafka, Redis, PostgreSQL), 130 interrupted.

Other packages add subcommands through entry points of the group `keel.commands` (pyproject.toml): each
names a `register(subparsers)` function. The core discovers them with importlib.metadata and never names
them; their shared helpers are in keel.commandline.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Self

from . import render
from .audit_commands import register as register_audit
from .cartridge_set import CartridgeSet, cartridge_paths, load_cartridges
from .change_commands import add_kafka_argument, cmd_diff, cmd_schema, log_source, validate_log
from .commandline import (
    COMMANDS_GROUP,
    KeelArgumentParser,
    add_clear_argument,
    add_events_arguments,
    emit,
    events_of,
    keys_of,
    pick_tenant,
    positive_int,
    settings_of,
)
from .connect import GraphSet, open_graphs
from .digest import digest, search_model, set_digest
from .echo import printable
from .errors import (
    EXIT_DOMAIN,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CartridgeInvalid,
    KeelError,
    ServiceUnavailable,
    UnknownTenant,
    UsageError,
)
from .logs import install as install_log_limit
from .privacy_commands import register as register_privacy

QUERY_HELP = {
    "context": "an entity as of a world time and a knowledge time: labels, facts, relations, rules",
    "history": "every version of an entity's labels, facts, notes and relations, superseded ones included; "
               "without ENTITY, the tenant's changes since --since",
    "search": "find entities by words of their ids, types, labels and visible notes, any script (BM25)",
    "related": "relations of an entity, either direction",
    "annotate": "write a note (agent memory) on an entity; appended to the events file",
}


SEVERAL = "cartridge folder, or several separated by commas (read together: docs/cartridges.md)"


def build_parser() -> argparse.ArgumentParser:
    parser = KeelArgumentParser(prog="keel", description=(
        "Keel projects domain events into one bitemporal graph per tenant and answers five tools "
        "(context, history, search, annotate, related). Start with `keel demo`."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=KeelArgumentParser)

    p = sub.add_parser("validate", help="check a cartridge (and optionally an events file or its topic)",
                       description="Check cartridge.yaml and handlers.py; with an events file or --kafka, also "
                                   "every envelope of that log (read, upcast and projected by this cartridge). "
                                   "Exit 0 when valid, 2 otherwise (one line per problem), 3 when Kafka cannot "
                                   "be read.")
    p.add_argument("cartridge", help=SEVERAL)
    add_events_arguments(p, "also check every line of this events file")
    add_kafka_argument(p, "also check the whole log on Kafka")
    add_log_keys_arguments(p)
    add_clear_argument(p)
    p.set_defaults(run=cmd_validate)

    p = sub.add_parser("diff", help="what a cartridge change does to every tenant's graph",
                       description="Build every tenant's graph of a log under the old and the new cartridge and "
                                   "report, per tenant, the entities, labels, facts, notes and relations added, "
                                   "removed or changed, with examples: what `keel replay --all` will do. Exit 0: no "
                                   "graph changes; 1: some do; 2: the new cartridge refuses events the old one "
                                   "applies (or bad arguments); 3: Kafka cannot be read.")
    p.add_argument("old", help="the cartridge folder deployed now")
    p.add_argument("new", help="the changed cartridge folder")
    add_events_arguments(p, "the log: this events file")
    add_kafka_argument(p, "the log")
    add_log_keys_arguments(p)
    add_clear_argument(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=cmd_diff)

    p = sub.add_parser("schema", help="JSON Schemas of a cartridge's envelopes, for producers",
                       description="Print the JSON Schema (draft 2020-12) of the cartridge's envelopes: the "
                                   "envelope, and each event type's payload per version (in $defs); with --event "
                                   "only that payload's.")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("--event", metavar="TYPE", help="only this event type's payload schema")
    p.add_argument("--version", type=positive_int, metavar="N", help="with --event: this version (default: the "
                   "cartridge's)")
    p.add_argument("--clear", dest="schema_clear", action="store_true",
                   help="personal fields in clear, as keel seal, keel publish, the outbox relay and the webhook take "
                   "them (default: sealed, as on the topic; docs/envelope.md)")
    p.set_defaults(run=cmd_schema)

    common = KeelArgumentParser(add_help=False)
    common.add_argument("--tenant", help="tenant to query (default: the only tenant in the file)")
    common.add_argument("--agent", help="the caller's agent id (who annotates, whose notes are visible)")
    common.add_argument("--task", help="the caller's task id (task notes are visible within the task)")
    common.add_argument("--json", action="store_true", help="print the tool's result object as JSON")
    common.add_argument("--redis", metavar="URL", help="query the Redis graph instead of an events file "
                        "(then omit the events file)")
    common.add_argument("--events", metavar="FILE", help="the events file, when not given as the first ARG")
    common.add_argument("--allow-global-notes", action="store_true", default=None,
                        help="operator switch: allow notes in global scope (env KEEL_ALLOW_GLOBAL_NOTES)")
    common.add_argument("--keys", metavar="FILE", help="key file that decrypts a sealed events file's personal "
                        "fields (docs/privacy.md; master key from KEEL_MASTER_KEY or KEEL_MASTER_KEY_FILE)")
    add_clear_argument(common)

    def query(name: str, run: Callable[..., int], usage_tail: str, nargs: str = "+") -> argparse.ArgumentParser:
        q = sub.add_parser(name, parents=[common], help=QUERY_HELP[name], description=QUERY_HELP[name],
                           usage=f"keel {name} CARTRIDGE (EVENTS.jsonl | --events FILE | --redis URL) {usage_tail} "
                                 f"[options]")
        q.add_argument("cartridge", help=SEVERAL)
        q.add_argument("args", nargs=nargs, metavar="ARG", help="the events file (unless --events or --redis), "
                       "then " + usage_tail)
        q.set_defaults(run=run)
        return q

    q = query("context", cmd_context, "ENTITY")
    q.add_argument("--at", help="world time (RFC 3339 or YYYY-MM-DD; default now)")
    q.add_argument("--known-at", help="knowledge time: what Keel believed then (default now)")
    q = query("history", cmd_history, "[ENTITY]", nargs="*")
    q.add_argument("--predicate", help="only the timelines of this name: a fact predicate, a label or a relation")
    q.add_argument("--known-at", help="knowledge time (default now)")
    q.add_argument("--since", help="without ENTITY: the tenant's changes recorded after this time")
    q.add_argument("--type", help="without ENTITY: only changes of entities of this type")
    q.add_argument("--cursor", help="without ENTITY: the next page, from a previous answer's cursor")
    q.add_argument("--limit", type=int, help="without ENTITY: at most N changes (default 100, at most 500)")
    q = query("search", cmd_search, "QUERY")
    q.add_argument("--type", help="only entities of this type")
    q.add_argument("--limit", type=int, default=10, help="at most N results (default 10)")
    q.add_argument("--at", help="world time: the labels and notes entities had then (default now)")
    q.add_argument("--known-at", help="knowledge time: as known then (default now)")
    q = query("related", cmd_related, "ENTITY [RELATION]")
    q.add_argument("--at", help="world time (default now)")
    q.add_argument("--known-at", help="knowledge time (default now)")
    q = query("annotate", cmd_annotate, "ENTITY PREDICATE [VALUE]")
    q.add_argument("--scope", required=True, choices=("global", "tenant", "task", "agent"),
                   help="who sees the note: tenant (everyone), task, agent (only you), global (operator-enabled)")
    q.add_argument("--evidence", metavar="EVENT_ID", help="id of the event that supports the note")
    q.add_argument("--withdraw", action="store_true",
                   help="close your own note of that name and scope now instead (no VALUE); kept in history")
    q.add_argument("--reason", help="with --withdraw: why (shown in history)")

    p = sub.add_parser("digest", help="hash of one tenant's graph (equal graphs, equal digests)",
                       description="Print sha256:<hex> over a canonical serialization of a tenant's graph. With several "
                                   "cartridges: a line `<cartridge> sha256:<hex>` each, then `all sha256:<hex>` "
                                   "over those lines.")
    p.add_argument("cartridge", help=SEVERAL)
    add_events_arguments(p, "build from this events file")
    p.add_argument("--tenant", help="tenant (default: the only tenant in the file)")
    p.add_argument("--redis", metavar="URL", help="read the Redis graph")
    p.add_argument("--keys", metavar="FILE", help="key file of a sealed events file (docs/privacy.md)")
    add_clear_argument(p)
    p.add_argument("--search-model", action="store_true",
                   help="also print `search-model <identity>`: the model behind search's semantic ranking "
                        "(equal graphs and equal models, equal rankings); not part of the digest")
    p.set_defaults(run=cmd_digest)

    p = sub.add_parser("demo", help="the finance story end to end, embedded (no servers)",
                       description="Build the graph of a cartridge's sample stream in memory and run its "
                                   "demo.py story. Default: the finance cartridge.")
    p.add_argument("cartridge", nargs="?", help="cartridge folder with a demo.py (default: cartridges/finance)")
    p.set_defaults(run=cmd_demo)

    register_audit(sub)
    register_privacy(sub)
    register_plugins(sub)
    for name in EMBEDDED_PLUGINS:           # plug-in commands that read events files through keel.connect
        if name in sub.choices and "clear" not in {a.dest for a in sub.choices[name]._actions}:
            add_clear_argument(sub.choices[name])
    return parser


def add_log_keys_arguments(parser: argparse.ArgumentParser) -> None:
    """The key store of a sealed log: an events file's key file, or with --kafka the deployment's key store."""
    parser.add_argument("--keys", metavar="FILE", help="key file of a sealed log (docs/privacy.md; with --kafka "
                        "also env KEEL_KEYS_FILE)")
    parser.add_argument("--keys-dsn", metavar="DSN", help="with --kafka: the deployment's PostgreSQL key store, as the "
                        "workers take it (env KEEL_KEYS_DSN)")
    parser.add_argument("--master-key-file", metavar="FILE", help="with --kafka: the master key (default: env "
                        "KEEL_MASTER_KEY or KEEL_MASTER_KEY_FILE)")


EMBEDDED_PLUGINS = ("serve", "inspect")     # `--clear` added to them here, honoured by keel.connect.open_graph


def register_plugins(sub: argparse._SubParsersAction) -> None:
    """Let every installed package of the `keel.commands` entry-point group add its subcommands (by name, so
    `keel --help` lists them in a stable order)."""
    found = sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name)
    if not found:
        raise UsageError(f"no `{COMMANDS_GROUP}` entry points are installed: reinstall Keel (`make install`, "
                         f"or `pip install -e .`) so that its packages register their commands")
    for ep in found:
        ep.load()(sub)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except UsageError as e:
        print(f"keel: {e}", file=sys.stderr)
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "args", None), list) and not any(x.startswith("-") for x in extra):
        args.args += extra          # a query's words after an option (`related F ENTITY --events E RELATION`)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    install_log_limit()       # library log lines: one per cause per interval (commands that configure logging
    try:                      # again call it again)
        return int(args.run(args) or 0)
    except BrokenPipeError:                      # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except CartridgeInvalid as e:
        for problem in e.problems:
            print(f"{e.path}: {problem}" if not problem.startswith(e.path) else problem, file=sys.stderr)
        return EXIT_USAGE
    except UsageError as e:
        print(printable(f"keel: {e}"), file=sys.stderr)
        return EXIT_USAGE
    except ServiceUnavailable as e:
        print(printable(f"keel: {e}"), file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeelError as e:
        print(printable(f"keel: {e}"), file=sys.stderr)
        return EXIT_DOMAIN
    except KeyboardInterrupt:
        print("keel: interrupted", file=sys.stderr)
        return 130


# ---- helpers ---------------------------------------------------------------------------------

class Session:
    """A cartridge, its opened graph (keel.connect) and the tenant a query command works on.

    The events file is `--events FILE`, else the first argument unless `--redis URL` is given; without either,
    when KEEL_REDIS_URL is set and the first argument is neither a file nor a `.jsonl` path, the command reads
    that Redis graph."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.cartridges = load_cartridges(args.cartridge)
        settings = settings_of(args)
        rest = list(args.args)
        events = args.events
        if events and args.redis:
            raise UsageError("give one of --events FILE or --redis URL")
        if not args.redis and not events:
            if not rest:
                raise UsageError("give the events file (or --redis URL)")
            if not settings.redis_url or Path(rest[0]).exists() or rest[0].endswith(".jsonl"):
                events = rest.pop(0)
        self.graph = open_graphs(self.cartridges, settings, events, keys=keys_of(args))
        self.rest = rest
        self.tenant = pick_tenant(args.tenant, self.graph.tenants)
        self.tools = self.graph.tools(tenant=self.tenant, agent=args.agent, task=args.task)   # as keel.open's

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.graph.close()


def take(rest: list[str], names: str, optional: int = 0) -> list[str | None]:
    wanted = names.split()
    if not len(wanted) - optional <= len(rest) <= len(wanted):
        raise UsageError(f"expected {' '.join(wanted)} after the events file, got {' '.join(rest) or 'nothing'}")
    return [*rest, *([None] * (len(wanted) - len(rest)))]


# ---- commands --------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    paths = cartridge_paths(args.cartridge)
    cartridges = load_cartridges(paths)
    if len(cartridges) > 1:
        if log_source(args, cartridges[0]) is not None:
            raise UsageError("check one cartridge's events at a time: give one cartridge with the events file "
                             "or --kafka")
        CartridgeSet(cartridges)                # clashes and cross references: CartridgeInvalid
    else:
        source = log_source(args, cartridges[0])
        if source is not None and (code := validate_log(args, cartridges[0], source)) != 0:
            return code
    for path, cartridge in zip(paths, cartridges):
        spec = cartridge.spec
        print(f"{path}: ok ({len(spec.entities)} entity types, {len(spec.relations)} relations, "
              f"{len(spec.events)} event types, {len(spec.rules)} rules)")
    if len(cartridges) > 1:
        print(f"together: ok ({len(cartridges)} cartridges; no clash of entity types or relation names)")
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    with Session(args) as s:
        (entity,) = take(s.rest, "ENTITY")
        return emit(args, s.tools.context(entity, at=args.at, known_at=args.known_at), render.context)


def cmd_history(args: argparse.Namespace) -> int:
    with Session(args) as s:
        (entity,) = take(s.rest, "ENTITY", optional=1)
        if entity is None:
            return emit(args, s.tools.history(since=args.since, type=args.type, cursor=args.cursor,
                                              limit=args.limit, predicate=args.predicate, known_at=args.known_at),
                        render.changes)
        return emit(args, s.tools.history(entity, predicate=args.predicate, known_at=args.known_at, since=args.since,
                                          type=args.type, cursor=args.cursor, limit=args.limit), render.history)


def cmd_search(args: argparse.Namespace) -> int:
    with Session(args) as s:
        query = " ".join(s.rest)
        return emit(args, s.tools.search(query, type=args.type, limit=args.limit, at=args.at,
                                         known_at=args.known_at), render.search)


def cmd_related(args: argparse.Namespace) -> int:
    with Session(args) as s:
        entity, relation = take(s.rest, "ENTITY RELATION", optional=1)
        return emit(args, s.tools.related(entity, relation=relation, at=args.at, known_at=args.known_at),
                    render.related)


def cmd_annotate(args: argparse.Namespace) -> int:
    with Session(args) as s:
        if args.withdraw:
            entity, predicate = take(s.rest, "ENTITY PREDICATE")
            result = s.tools.annotate(entity, predicate, scope=args.scope, evidence=args.evidence, withdraw=True,
                                      reason=args.reason)
            return emit(args, result, render.note)
        if args.reason is not None:
            raise UsageError("--reason goes with --withdraw (why a note is withdrawn)")
        entity, predicate, value = take(s.rest, "ENTITY PREDICATE VALUE")
        result = s.tools.annotate(entity, predicate, parse_value(value), args.scope, evidence=args.evidence)
        return emit(args, result, render.note)


def parse_value(text: str | None) -> Any:
    """A note value: JSON when it parses as JSON (numbers, true, objects), else the text itself."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_digest(args: argparse.Namespace) -> int:
    cartridges = load_cartridges(args.cartridge)
    events = events_of(args)
    if events and args.redis:
        raise UsageError("give exactly one of an events file or --redis URL")
    with open_graphs(cartridges, settings_of(args), events, keys=keys_of(args)) as graph:
        tenant = pick_tenant(args.tenant, graph.tenants)
        if isinstance(graph, GraphSet):
            if not graph.has_tenant(tenant):
                raise UnknownTenant(tenant)
            print(set_digest({name: g.store for name, g in graph.graphs.items()}, tenant))
        else:
            if not graph.store.has_tenant(tenant):
                raise UnknownTenant(tenant)
            print(digest(graph.store, tenant))
    if args.search_model:                      # beside the digest, not in it (docs/semantics.md, "Search")
        print(search_model(cartridges))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    folder = Path(args.cartridge) if args.cartridge else default_demo_cartridge()
    return run_demo(folder, sys.stdout)


def default_demo_cartridge() -> Path:
    for base in (Path.cwd(), Path(__file__).resolve().parents[1]):
        candidate = base / "cartridges" / "finance"
        if (candidate / "demo.py").is_file():
            return candidate
    raise UsageError("cartridges/finance not found; run from the Keel checkout or pass a cartridge folder")


if __name__ == "__main__":
    raise SystemExit(main())
