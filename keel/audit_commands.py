"""`keel audit show ID` and `keel audit replay ID`: an audit record of a tool call (keel.audit), and the same
question asked again as known at the record's `known_through`, on the same graph, with the verdict whether the
answer is byte for byte the one the agent got (docs/operations.md, "Audit log")."""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from . import audit
from .cartridge_set import CartridgeSet, load_cartridges
from .commandline import add_events_arguments, events_of, keys_of, settings_of
from .connect import open_graphs
from .echo import printable
from .envelope import ERASED
from .errors import EXIT_DOMAIN, KeelError, UsageError
from .times import parse_time

AUDIT_ENV = "KEEL_AUDIT_LOG"
PLAINTEXT = {"entity": "--entity", "query": "--query", "evidence": None}   # hashed arguments a replay is given


def register(sub: argparse._SubParsersAction) -> None:
    """`keel audit show|replay`, added by keel.cli."""
    p = sub.add_parser("audit", help="show an audit record of a tool call, or ask its question again",
                       description="Every tool call `keel serve --audit FILE` answers is recorded (docs/operations.md, "
                                   "\"Audit log\"). `show` prints a record; `replay` asks the same question again "
                                   "as known at the record's known_through and says whether the answer is "
                                   "identical, byte for byte.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    log_help = (f"the JSON-lines audit log, or `kafka` for the topic keel.<cartridge>.audit (env {AUDIT_ENV})")
    kafka_help = "with --audit kafka: the bootstrap servers (env KEEL_KAFKA_BOOTSTRAP)"

    s = verbs.add_parser("show", help="print one record", description="Print the audit record ID.")
    s.add_argument("id", help="the record's id")
    s.add_argument("--audit", metavar="FILE|kafka", help=log_help)
    s.add_argument("--cartridge", metavar="NAME", help="with --audit kafka: the cartridge's name (its topic)")
    s.add_argument("--kafka", metavar="BOOTSTRAP", help=kafka_help)
    s.add_argument("--json", action="store_true", help="print the record as one JSON object")
    s.set_defaults(run=cmd_show)

    r = verbs.add_parser("replay", help="ask a recorded question again and compare the answers",
                         description="Ask the recorded call again with known_at = its known_through and at = its "
                                     "world time, on the graph given (the events file or Redis the server "
                                     "answered from), and compare the sha256 of the answer's reproducible part "
                                     "(`lag`, `lag_measured_at`, `applied_through` and the `at`/`known_at` echoes "
                                     "left out). Entity ids and queries are recorded as hashes: give them with "
                                     "--entity / --query; they are checked against the record. Exit 0: identical; "
                                     "1: the answer differs (or the call cannot be replayed); 2: usage.")
    r.add_argument("id", help="the record's id")
    r.add_argument("cartridge", help="cartridge folder, or the folders the server served, separated by commas")
    add_events_arguments(r, "the events file the server answered from (one per cartridge, separated by commas)")
    r.add_argument("--redis", metavar="URL", help="the Redis graph the server answered from (env KEEL_REDIS_URL)")
    r.add_argument("--keys", metavar="FILE", help="the key file of a sealed events file (docs/privacy.md)")
    r.add_argument("--audit", metavar="FILE|kafka", help=log_help)
    r.add_argument("--kafka", metavar="BOOTSTRAP", help=kafka_help)
    r.add_argument("--entity", help="the entity id the call asked about (checked against the record's sha256)")
    r.add_argument("--query", help="the search query of the call (checked against the record's sha256)")
    r.add_argument("--json", action="store_true", help="print the verdict as JSON")
    r.set_defaults(run=cmd_replay)


def find(args: argparse.Namespace, cartridge: str | None) -> dict[str, Any]:
    """The record args.id of the audit log `--audit FILE|kafka` (else KEEL_AUDIT_LOG)."""
    where = args.audit or os.environ.get(AUDIT_ENV, "").strip()
    if not where:
        raise UsageError(f"give the audit log: --audit FILE (or kafka), or {AUDIT_ENV}")
    if where != "kafka":
        return audit.find_record(where, args.id)
    if not cartridge:
        raise UsageError("--audit kafka: give --cartridge NAME (the topic is keel.<cartridge>.audit)")
    # Kafka's client only when the topic is read
    from .kafka_audit import audit_topic, find_topic_record
    return find_topic_record(settings_of(args).kafka_bootstrap, audit_topic(cartridge), args.id)


def cmd_show(args: argparse.Namespace) -> int:
    record = find(args, args.cartridge)
    if args.json:
        print(json.dumps(record, ensure_ascii=False))
        return 0
    width = max(len(k) for k in record)
    for key, value in record.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        print(printable(f"{key.ljust(width)}  {shown}"))
    return 0


def replay_call(record: dict[str, Any], tools: Any, plaintext: dict[str, str | None]) -> dict[str, Any]:
    """The recorded call asked again on `tools` (a keel.tools.Tools bound to the recorded caller): the result.
    `plaintext` holds the hashed arguments' values, each checked against the record's sha256."""
    tool = record.get("tool")
    if tool not in audit.READERS:
        raise UsageError(f"a {tool} call cannot be replayed: only the readers ({', '.join(audit.READERS)}) are; "
                         f"annotate writes, and its record keeps no note value")
    if record.get("outcome") not in ("ok", "miss") or not record.get("answer_sha256"):
        raise UsageError(f"record {record.get('id')} holds no answer (outcome {record.get('outcome')}): nothing "
                         f"to reproduce")
    kept = dict(record.get("arguments") or {})
    args: dict[str, Any] = {}
    for name, value in kept.items():
        if isinstance(value, dict) and "sha256" in value:
            given = plaintext.get(name)
            flag = PLAINTEXT.get(name)
            if given is None:
                raise UsageError(f"the record keeps the {name} as a hash only: give it with {flag}" if flag else
                                 f"the record keeps the {name} as a hash only and it cannot be given")
            if audit.value_sha256(given) != value["sha256"]:
                raise UsageError(f"{flag} does not match the record's {name} (sha256 differs)")
            args[name] = given
        else:
            args[name] = value
    known_at = record.get("known_through") or record.get("when")
    at = record.get("at")
    if tool == "context":
        return tools.context(args.get("entity"), at=at, known_at=known_at)
    if tool == "history":
        return tools.history(args.get("entity"), predicate=args.get("predicate"), known_at=known_at)
    if tool == "search":
        return tools.search(args.get("query"), type=args.get("type"), limit=args.get("limit", 10), at=at,
                            known_at=known_at)
    return tools.related(args.get("entity"), relation=args.get("relation"), at=at, known_at=known_at)


def cmd_replay(args: argparse.Namespace) -> int:
    cartridges = load_cartridges(args.cartridge)
    name = cartridges[0].name if len(cartridges) == 1 else CartridgeSet(cartridges).name   # as the server records it
    record = find(args, name)
    if record.get("cartridge") not in (None, name):
        raise UsageError(f"record {args.id} is of cartridge {record.get('cartridge')!r}, not {name!r}")
    events = events_of(args)
    if events and args.redis:
        raise UsageError("give one of an events file (or --events FILE) or --redis URL")
    with open_graphs(cartridges, settings_of(args), events, keys=keys_of(args)) as graph:
        tools = graph.tools(tenant=record["tenant"], agent=record.get("agent"), task=record.get("task"))
        try:
            result = replay_call(record, tools, {"entity": args.entity, "query": args.query})
        except UsageError:
            raise
        except KeelError as e:          # e.g. the entity is unknown now: the answer cannot be the same
            return _verdict(args, record, None, f"{type(e).__name__}: {e}",
                            erasures_after(events, record["tenant"], record.get("when")))
    return _verdict(args, record, result, None, erasures_after(events, record["tenant"], record.get("when")))


def erasures_after(events: str | None, tenant: str, when: str | None) -> list[dict[str, Any]]:
    """The `keel.erased` receipts of `tenant` in the events files (one, or several separated by commas) recorded
    after the answer (`when`): an erasure masks personal values as known at any time, so an answer that showed
    them cannot be reproduced. Receipts are named by id and time only (their subject is an entity id, kept out of
    the verdict like the record's)."""
    if not events or when is None:
        return []
    after = parse_time(when)
    found = []
    for path in events.split(","):
        found += _erasures_in(path.strip(), tenant, after)
    return found


def _erasures_in(path: str, tenant: str, after: int) -> list[dict[str, Any]]:
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if ERASED not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if not isinstance(e, dict) or e.get("type") != ERASED or e.get("tenant") != tenant:
                continue
            at = e.get("recorded_at") or e.get("occurred_at")
            try:
                later = at is not None and parse_time(at) >= after
            except KeelError:
                continue
            if later:
                found.append({"event_id": e.get("id"), "recorded_at": at})
    return found


def _verdict(args: argparse.Namespace, record: dict[str, Any], result: dict[str, Any] | None,
             error: str | None, erasures: list[dict[str, Any]]) -> int:
    digest = audit.sha256(audit.answer_bytes(result)) if result is not None else None
    same = digest == record.get("answer_sha256")
    verdict = {"id": record["id"], "tool": record["tool"], "at": record.get("at"),
               "known_through": record.get("known_through"), "identical": same,
               "recorded_sha256": record.get("answer_sha256"), "replayed_sha256": digest}
    if result is not None and result.get("known_through") != record.get("known_through"):
        verdict["replayed_known_through"] = result.get("known_through")
    if error:
        verdict["error"] = error
    if not same and erasures:
        verdict["erasures"] = erasures
        verdict["why"] = (f"erasure intervened: {len(erasures)} data subject(s) of this tenant were erased after "
                          f"the answer (keel.erased {', '.join(str(x['event_id']) for x in erasures)}); their "
                          f"personal values now read as the cartridge's mask at every known_at")
    elif not same:
        verdict["why"] = ("the graph no longer holds what was known then: events recorded at or before "
                          "known_through were applied after the answer (the answer's lag was not 0), the "
                          "cartridge changed, or the graph is not the one the server answered from")
    if args.json:
        print(json.dumps(verdict, ensure_ascii=False))
    elif same:
        print(f"identical: {record['tool']} as known at {record.get('known_through')} gives the same answer "
              f"(sha256 {digest})")
    else:
        print(printable(f"differs: {record['tool']} as known at {record.get('known_through')} now gives "
                        f"{'an error: ' + error if error else 'sha256 ' + str(digest)}, recorded "
                        f"{record.get('answer_sha256')}; {verdict['why']}"))
    return 0 if same else EXIT_DOMAIN
