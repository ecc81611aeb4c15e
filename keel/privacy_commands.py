"""`keel seal` and `keel erase` (docs/privacy.md): an events file's personal fields encrypted per data subject,
and a data subject's keys erased with a receipt in the log. keel.cli registers them; the cryptography and the
key store are keel/privacy.py. This slice covers embedded mode (events files and a key file)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from .cartridge import load_cartridge
from .commandline import key_store_arguments, settings_of
from .connect import open_graph
from .echo import cut, printable
from .embedded import BOM, open_events
from .envelope import ERASED, MAX_REASON, OFFBOARDED
from .errors import EXIT_DOMAIN, EXIT_USAGE, EnvelopeRejected, UsageError
from .identifiers import ENTITY, TENANT
from .keystore import b64, open_key_file
from .privacy import Privacy
from .times import format_time, now_micros

MASTER_HELP = "a file holding the master key (default: KEEL_MASTER_KEY, else KEEL_MASTER_KEY_FILE)"


def register(sub: argparse._SubParsersAction) -> None:
    """`keel seal` and `keel erase`, added by keel.cli."""
    p = sub.add_parser("seal", help="encrypt an events file's personal fields (keys in a key file)",
                       description="Write OUT: every line of IN with the personal fields the cartridge declares "
                                   "(`personal:` in cartridge.yaml) encrypted with its data subject's key, "
                                   "created in the key file as needed (docs/privacy.md). Lines of other event "
                                   "types are copied as they are; a line that is not JSON is refused and left "
                                   "out (exit 2). IN is not changed: delete it once OUT is checked.")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("input", metavar="IN", help="the events file in clear")
    p.add_argument("output", metavar="OUT", help="the sealed events file to write (replaced atomically)")
    p.add_argument("--keys", metavar="FILE", required=True, help="the key file (created when missing; mode 0600)")
    p.add_argument("--master-key-file", metavar="FILE", help=MASTER_HELP)
    p.set_defaults(run=cmd_seal)

    p = sub.add_parser("erase", help="erase a data subject's personal data: delete its keys, log a receipt",
                       description="Delete every key of the data subject S of tenant T from the key file, so "
                                   "that every copy of its sealed personal fields reads as the cartridge's mask, "
                                   "and append a keel.erased receipt (no personal data: the subject, how many "
                                   "keys, the reason) to the events file. Idempotent: a second call says when it "
                                   "was done. Embedded mode: --events FILE --keys FILE; Redis/Kafka mode (--redis, "
                                   "--kafka, added by the workers package): the receipt goes to the topic and "
                                   "tenant T is rebuilt from the log (docs/privacy.md). Exit 1 when the key store "
                                   "never held a key of S.")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("--events", metavar="FILE", help="embedded mode: the sealed events file (the receipt is "
                   "appended)")
    p.add_argument("--keys", metavar="FILE", help="the key file")
    p.add_argument("--tenant", required=True, help="the tenant")
    p.add_argument("--subject", required=True, help="the data subject, an entity reference (type:id)")
    p.add_argument("--reason", help="why (kept in the receipt: never write personal data here)")
    p.add_argument("--master-key-file", metavar="FILE", help=MASTER_HELP)
    p.set_defaults(run=cmd_erase)

    p = sub.add_parser("offboard", help="offboard a tenant: shred its keys, drop its graph, refuse its events",
                       description="Tenant T leaves: every key of T is deleted from the key store (its sealed "
                                   "fields read as the mask for good), a keel.offboarded receipt (no personal "
                                   "data: how many keys, the reason) is written to the log, and T's graph is "
                                   "dropped; T's later events are refused. Idempotent: a second call says when it "
                                   "was done. Embedded mode: --events FILE [--keys FILE]; Redis/Kafka mode "
                                   "(--redis, --kafka, added by the workers package) drops every Redis key of T "
                                   "(docs/privacy.md).")
    p.add_argument("cartridge", help="cartridge folder")
    p.add_argument("--events", metavar="FILE", help="embedded mode: the events file (the receipt is appended)")
    p.add_argument("--keys", metavar="FILE", help="the key file (a cartridge with personal fields)")
    p.add_argument("--tenant", required=True, help="the tenant that leaves")
    p.add_argument("--reason", help="why (kept in the receipt: never write personal data here)")
    p.add_argument("--master-key-file", metavar="FILE", help=MASTER_HELP)
    p.set_defaults(run=cmd_offboard)

    p = sub.add_parser("data-key", parents=[key_store_arguments()],
                       help="hand out a data subject's data key, for a producer that seals in another language",
                       description="Print, as JSON, the data key (base64) and key id of data subject S of tenant T, "
                                   "created in the key store when S has none: a producer in another language seals "
                                   "S's personal fields with it (docs/privacy.md, \"Wire format\"). The key reads "
                                   "every personal field of S: send it over a protected channel, keep it in memory "
                                   "only, and drop it when S is erased (an erasure cannot recall a copy). Exit 2 "
                                   "for an offboarded tenant.")
    p.add_argument("cartridge", help="cartridge folder (it must declare personal fields)")
    p.add_argument("--tenant", required=True, help="the tenant")
    p.add_argument("--subject", required=True, help="the data subject, an entity reference (type:id)")
    p.set_defaults(run=cmd_data_key)


def cmd_seal(args: argparse.Namespace) -> int:
    cartridge = load_cartridge(args.cartridge)
    source, target = Path(args.input), Path(args.output)
    if target.exists() and source.exists() and target.resolve() == source.resolve():
        raise UsageError("OUT must be another file than IN (IN is kept until you have checked OUT)")
    if not cartridge.spec.personal:
        raise UsageError(f"cartridge {cartridge.name!r} declares no personal fields (`personal:` in "
                         f"cartridge.yaml); there is nothing to seal")
    keys = open_key_file(args.keys, create=True, master_file=args.master_key_file)
    privacy = Privacy(cartridge, keys)
    refused = sealed = lines = 0
    folder = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with open_events(source) as f, os.fdopen(fd, "wb") as out, keys.batch():
            for number, raw in enumerate(f, 1):
                lines = number
                if number == 1 and raw.startswith(BOM):
                    raw = raw[len(BOM):]
                if not raw.strip():
                    out.write(raw)
                    continue
                reason = None
                try:
                    envelope = json.loads(raw)
                except ValueError:
                    reason = "not a JSON line"      # its text may hold personal data: neither copied nor shown
                else:
                    try:
                        done = privacy.seal(envelope) if isinstance(envelope, dict) else envelope
                    except EnvelopeRejected as e:
                        reason = e.reason
                if reason is not None:
                    refused += 1
                    print(printable(cut(f"{source}:line {number}: refused, left out of {target}: {reason}", 600)),
                          file=sys.stderr)
                    continue
                if done is envelope:
                    out.write(raw if raw.endswith(b"\n") else raw + b"\n")
                else:
                    sealed += 1
                    out.write(json.dumps(done, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)         # after the key file holds every key used (keys.batch ended)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    print(f"{target}: {lines} lines, {sealed} sealed, {refused} refused; keys in {args.keys}")
    return EXIT_USAGE if refused else 0


def check_erase_arguments(tenant: str, subject: str, reason: str | None) -> None:
    """Usage errors of `keel erase` (either mode), before anything changes."""
    if not TENANT.match(tenant):
        raise UsageError(f"--tenant {tenant!r}: ASCII letters, digits and . _ - (at most 64 characters)")
    if not ENTITY.match(subject):
        raise UsageError(f"--subject {subject!r}: the data subject's entity reference, type:id")
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"--reason: at most {MAX_REASON} characters")


def receipt_id(tenant: str, subject: str, done: dict[str, object]) -> str:
    """The id of an erasure's receipt: the same for every call about that erasure (idempotent)."""
    return "erased-" + hashlib.sha256(f"{tenant}\0{subject}\0{done['at']}".encode()).hexdigest()[:24]


def receipt(tenant: str, subject: str, done: dict[str, object], reason: str | None) -> dict[str, object]:
    """The PII-free `keel.erased` envelope of an erasure: the subject, how many keys, the reason."""
    payload: dict[str, object] = {"keys": done["keys"]}
    if reason is not None:
        payload["reason"] = reason
    return {"id": receipt_id(tenant, subject, done), "tenant": tenant, "type": ERASED, "subject": subject,
            "occurred_at": done["at"], "recorded_at": format_time(now_micros()), "source": "keel",
            "payload": payload}


def cmd_erase(args: argparse.Namespace) -> int:
    tenant, subject, reason = args.tenant, args.subject, args.reason
    check_erase_arguments(tenant, subject, reason)
    if not args.events or not args.keys:
        raise UsageError("give --events FILE --keys FILE (embedded mode), or --redis URL --kafka BOOTSTRAP with "
                         "the key store (Redis/Kafka mode)")
    cartridge = load_cartridge(args.cartridge)
    events = Path(args.events)
    open_events(events).close()             # a missing or unreadable events file: a usage error, before any change
    keys = open_key_file(args.keys, master_file=args.master_key_file)
    deleted = keys.erase(tenant, subject, reason=reason)
    done = keys.erasure(tenant, subject)
    if done is None:
        print(f"keel: the key file {args.keys} never held a key of {subject} in tenant {tenant}: nothing to erase",
              file=sys.stderr)
        return EXIT_DOMAIN
    rid = receipt_id(tenant, subject, done)
    with open_graph(cartridge, settings_of(argparse.Namespace()), events, keys=keys,
                    stream=sys.stderr) as graph:
        if graph.store.has_event(tenant, rid):
            print(f"{subject} of tenant {tenant}: already erased at {done['at']} ({keys_text(done['keys'])}; receipt "
                  f"{rid} in {events})")
            return 0
        assert graph.log is not None
        graph.log.append(receipt(tenant, subject, done, reason))
    what = "erased" if deleted else f"already erased at {done['at']}; its receipt was missing and is"
    print(f"{subject} of tenant {tenant}: {what} ({keys_text(done['keys'])} deleted); receipt {rid} appended to "
          f"{events}")
    return 0


def keys_text(count: int) -> str:
    return f"{count} key" if count == 1 else f"{count} keys"


def check_offboard_arguments(tenant: str, reason: str | None) -> None:
    """Usage errors of `keel offboard` (either mode), before anything changes."""
    if not TENANT.match(tenant):
        raise UsageError(f"--tenant {tenant!r}: ASCII letters, digits and . _ - (at most 64 characters)")
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"--reason: at most {MAX_REASON} characters")


def offboard_receipt_id(tenant: str, at: str) -> str:
    """The id of an offboarding's receipt: the same for every call about that offboarding (idempotent)."""
    return "offboarded-" + hashlib.sha256(f"{tenant}\0{at}".encode()).hexdigest()[:24]


def offboard_receipt(tenant: str, at: str, keys: int, reason: str | None) -> dict[str, object]:
    """The PII-free `keel.offboarded` envelope: the tenant (its envelope's tenant and subject `tenant:<T>`), how
    many keys were shredded, the reason."""
    payload: dict[str, object] = {"keys": keys}
    if reason is not None:
        payload["reason"] = reason
    return {"id": offboard_receipt_id(tenant, at), "tenant": tenant, "type": OFFBOARDED, "subject": f"tenant:{tenant}",
            "occurred_at": at, "recorded_at": format_time(now_micros()), "source": "keel", "payload": payload}


def file_receipt(events: Path, tenant: str) -> dict[str, object] | None:
    """The `keel.offboarded` receipt of `tenant` in an events file, or None."""
    marker = OFFBOARDED.encode()
    with open_events(events) as f:
        for raw in f:
            if marker not in raw:
                continue
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if isinstance(e, dict) and e.get("type") == OFFBOARDED and e.get("tenant") == tenant:
                return e
    return None


def cmd_offboard(args: argparse.Namespace) -> int:
    tenant, reason = args.tenant, args.reason
    check_offboard_arguments(tenant, reason)
    if not args.events:
        raise UsageError("give --events FILE (embedded mode), or --redis URL --kafka BOOTSTRAP (Redis/Kafka mode)")
    cartridge = load_cartridge(args.cartridge)
    events = Path(args.events)
    if cartridge.spec.personal and not args.keys:
        raise UsageError(f"cartridge {cartridge.name!r} declares personal fields: give its key file (--keys FILE), "
                         f"whose keys of tenant {tenant} are shredded")
    found = file_receipt(events, tenant)        # also: a missing or unreadable events file, before any change
    keys = open_key_file(args.keys, master_file=args.master_key_file) if args.keys else None
    done = None if keys is None else keys.offboard(tenant, reason=reason)
    if found is not None:
        print(f"tenant {tenant}: already offboarded at {found.get('occurred_at')} (receipt {found.get('id')} in "
              f"{events})")
        return 0
    at = str(done["at"]) if done is not None else format_time(now_micros())
    count = int(done["keys"]) if done is not None else 0
    envelope = offboard_receipt(tenant, at, count, reason)
    with open_graph(cartridge, settings_of(argparse.Namespace()), events, keys=keys, stream=sys.stderr) as graph:
        assert graph.log is not None
        graph.log.append(envelope)
    print(f"tenant {tenant}: offboarded ({keys_text(count)} deleted); receipt {envelope['id']} appended to {events}; "
          f"its events are refused from now on")
    return 0


def cmd_data_key(args: argparse.Namespace) -> int:
    """`keel data-key`: the data key of one subject, for a producer that seals by itself."""
    from .keystore_pg import open_key_store  # psycopg only for the commands that open a key store
    cartridge = load_cartridge(args.cartridge)
    if not cartridge.spec.personal:
        raise UsageError(f"cartridge {cartridge.name!r} declares no personal fields (`personal:` in cartridge.yaml)")
    if not TENANT.match(args.tenant):
        raise UsageError(f"bad tenant {args.tenant!r}")
    if not ENTITY.match(args.subject):
        raise UsageError("--subject: an entity reference (type:id)")
    settings = settings_of(args)
    keys = open_key_store(keys_file=settings.keys_file, keys_dsn=settings.keys_dsn,
                          master_file=settings.master_key_file, create=True)
    if keys is None:
        raise UsageError("give the key store: --keys-dsn DSN (KEEL_KEYS_DSN) or --keys FILE (KEEL_KEYS_FILE)")
    kid, key = keys.key_for(args.tenant, args.subject)
    print(json.dumps({"cartridge": cartridge.name, "tenant": args.tenant, "subject": args.subject, "kid": kid,
                      "key": b64(key), "alg": "AES-256-GCM"}))
    return 0
