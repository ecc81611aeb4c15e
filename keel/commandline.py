"""Helpers every `keel` subcommand shares, whichever package adds it: the parser class, argument types,
settings from flags, choosing the tenant and printing results.

keel.cli is the entry point and imports this; the packages that plug in their subcommands (entry points
of the group `keel.commands`, see keel.cli) import from here, never from keel.cli.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from .config import Settings, resolve
from .echo import printable
from .errors import UsageError
from .keystore import FileKeyStore, KeyStore, open_key_file

COMMANDS_GROUP = "keel.commands"     # entry points: `name = "package.module:register"`, register(subparsers)


class KeelArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors exit 2 with a pointer to --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"keel: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def key_store_arguments(what: str = "the PostgreSQL key store of a cartridge's personal fields") -> argparse.ArgumentParser:
    """A parent parser: the key store (`--keys-dsn` or `--keys`) and the master key of sealed personal fields."""
    keys = argparse.ArgumentParser(add_help=False)
    keys.add_argument("--keys-dsn", metavar="DSN", help=f"{what} (env KEEL_KEYS_DSN; docs/privacy.md)")
    keys.add_argument("--keys", metavar="FILE", help="or a key file (env KEEL_KEYS_FILE)")
    keys.add_argument("--master-key-file", metavar="FILE", help="the master key (default: env KEEL_MASTER_KEY or "
                      "KEEL_MASTER_KEY_FILE)")
    return keys


def add_events_arguments(parser: argparse.ArgumentParser, help: str) -> None:
    """An events file a command reads, in either spelling: an optional argument after the cartridge, or
    `--events FILE` (read them with `events_of`). Every command that reads an events file takes both."""
    parser.add_argument("events_file", nargs="?", metavar="EVENTS", help=f"{help} (or --events FILE)")
    parser.add_argument("--events", metavar="FILE", help=help)


CLEAR_HELP = ("read the events file's personal fields in clear, for this run only (a cartridge's own clear sample, "
              "before `keel seal`): one warning on stderr; never with --redis or --kafka (docs/privacy.md)")


def add_clear_argument(parser: argparse.ArgumentParser) -> None:
    """`--clear` of a command that reads an events file: settings_of puts it in Settings.clear, and
    keel.connect.open_graph (or the log a command reads) honours it and warns, in one place."""
    parser.add_argument("--clear", action="store_true", default=None, help=CLEAR_HELP)


def events_of(args: argparse.Namespace) -> str | None:
    """The events file of a command given `add_events_arguments`, or of `--events` alone (None: none given)."""
    given = {x for x in (getattr(args, "events_file", None), getattr(args, "events", None)) if x}
    if len(given) > 1:
        raise UsageError(f"two events files given ({', '.join(sorted(given))}); give one, as an argument or "
                         f"with --events")
    return given.pop() if given else None


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings of a command: its flags, then KEEL_* variables, then defaults."""
    return resolve(vars(args))


def pick_tenant(given: str | None, tenants: list[str] | None) -> str:
    """The tenant a command works on: the one given, else the only one of an events file."""
    if given:
        return given
    if tenants is None:
        raise UsageError("--tenant is required with --redis")
    if len(tenants) == 1:
        return tenants[0]
    if not tenants:
        raise UsageError("the events file holds no valid event, so there is no tenant to query")
    raise UsageError(f"the events file holds several tenants ({', '.join(tenants)}); pass --tenant")


def emit(args: argparse.Namespace, result: Any, human: Callable[[Any], str]) -> int:
    """Print a tool's result: JSON with --json, else its human rendering."""
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        print(printable(human(result)))        # stored text never drives the terminal (ANSI, NUL)
    return 0


def keys_of(args: argparse.Namespace) -> FileKeyStore | None:
    """The key file of `--keys FILE`, which decrypts a sealed events file's personal fields (None: not given)."""
    path = getattr(args, "keys", None)
    return None if path is None else open_key_file(path, master_file=getattr(args, "master_key_file", None))


def deployment_keys_of(args: argparse.Namespace) -> KeyStore | None:
    """The key store a command reading the topic decrypts with: the deployment's, as the workers take it
    (`--keys-dsn` / KEEL_KEYS_DSN, or `--keys` / KEEL_KEYS_FILE; master key `--master-key-file`, KEEL_MASTER_KEY,
    KEEL_MASTER_KEY_FILE); None when none is given."""
    from .keystore_pg import open_key_store  # psycopg only for the commands that open a key store
    settings = settings_of(args)
    return open_key_store(keys_file=settings.keys_file, keys_dsn=settings.keys_dsn,
                          master_file=settings.master_key_file)
