"""`keel seal` and `keel erase` (docs/privacy.md): an events file's personal fields encrypted per data subject,
and a data subject's keys erased with a receipt in the log. keel.cli registers them; the cryptography and the
key store are keel/privacy.py. This slice covers embedded mode (events files and a key file)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .cartridge import load_cartridge
from .echo import cut, printable
from .embedded import BOM, open_events
from .errors import EXIT_USAGE, EnvelopeRejected, UsageError
from .privacy import Privacy, open_key_file

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
