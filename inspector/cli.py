"""`keel inspect` (entry point `inspector` of the group `keel.commands`): the read-only inspector page.

Heavy imports (Starlette, Jinja2, uvicorn) happen inside the command, so other `keel` commands stay fast.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from contextlib import ExitStack

from keel.cartridge import load_cartridge
from keel.commandline import keys_of, settings_of
from keel.connect import Graph, open_graph
from keel.errors import EXIT_UNAVAILABLE, UsageError
from keel.logs import add_log_arguments, log_format, setup_logging
from keel.sockets import bind_socket
from keel.tokens import Identity, TokenTable, tokens_path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8766
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `keel inspect` to the `keel` parser."""
    p = sub.add_parser(
        "inspect", help="serve a read-only page to look at the graph: entities, history, the bitemporal picture",
        usage="keel inspect CARTRIDGE... (--events FILE... | --redis URL) [options]",
        description="Serve read-only HTML pages on 127.0.0.1: pick a tenant, search, and look at an entity as of "
                    "a world time (at) and a knowledge time (known_at): labels, facts, relations, rule verdicts, "
                    "notes, each timeline's versions drawn as rectangles (valid time across, recorded time up) "
                    "and its history. Everything is read through the five tools' Python API, as an agent gets "
                    "it. Beyond loopback a bearer token from the tokens file of `keel serve` is required, and "
                    "it shows only the token's tenant.")
    p.add_argument("cartridges", nargs="+", metavar="CARTRIDGE", help="cartridge folder(s)")
    p.add_argument("--events", metavar="FILE", action="append", default=[],
                   help="embedded: an events file per cartridge, in the same order (repeat for several)")
    p.add_argument("--keys", metavar="FILE", help="embedded: the key file that decrypts sealed events files' "
                                                  "personal fields (docs/privacy.md; master key from KEEL_MASTER_KEY)")
    p.add_argument("--redis", metavar="URL", help="read the Redis graph the workers maintain (env KEEL_REDIS_URL)")
    p.add_argument("--kafka", metavar="BOOTSTRAP", help="with --redis: where answers' lag is measured "
                                                        "(env KEEL_KAFKA_BOOTSTRAP)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST}); any other "
                                                        f"needs --tokens")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--tokens", metavar="FILE", help="require a bearer token of this tokens file, the one of "
                                                    "`keel serve` (env KEEL_TOKENS_FILE); each sees its tenant")
    p.add_argument("--tenant", action="append", default=[], metavar="T",
                   help="list this tenant in the picker (repeatable; a Redis graph names none by itself); "
                        "with --tokens: accept only this tenant's tokens")
    p.add_argument("--agent", help="without --tokens: show the notes this agent sees (its agent notes)")
    p.add_argument("--task", help="without --tokens: show the notes of this task too")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept requests whose Host is NAME (repeatable; for a name behind a proxy)")
    add_log_arguments(p)
    p.set_defaults(run=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    setup_logging(log_format(args.log_format))
    say = logging.getLogger("keel.inspect")
    table = _tokens(args)
    with ExitStack() as stack:
        graphs = {name: stack.enter_context(graph) for name, graph in _open(args).items()}
        from .app import Inspector, Options  # Starlette and Jinja2 only for this command

        hosts = [*LOOPBACK, *([args.host] if args.host not in ("0.0.0.0", "::") else []),
                 *(h.split(":")[0] if not h.startswith("[") else h[1:].split("]")[0] for h in args.allow_host)]
        options = Options(tokens=table, agent=args.agent, task=args.task, tenants=list(args.tenant), hosts=hosts)
        app = Inspector(graphs, options).app()
        shown = f"[{args.host}]" if ":" in args.host else args.host
        try:
            sock = bind_socket(args.host, args.port)
        except OSError as e:
            say.error(f"cannot listen on {shown}:{args.port}: {e.strerror or e} (another server on this port? "
                      f"pick another with --port)")
            return EXIT_UNAVAILABLE
        access = "a bearer token of the tokens file" if table is not None else "no token (loopback only)"
        say.info(f"http://{shown}:{args.port}/ ({', '.join(graphs)}; {access}); read-only")
        if args.host not in LOOPBACK and not args.allow_host:
            say.warning(f"bound to {args.host}: requests are refused unless their Host is loopback or "
                        f"{args.host}; pass --allow-host NAME for the names browsers use")
        asyncio.run(_serve(app, sock, table))
    return 0


def _tokens(args: argparse.Namespace) -> TokenTable | None:
    """The tokens the page asks for: required beyond loopback, and whenever a tokens file is named."""
    path = tokens_path(args.tokens)
    if path is None:
        if args.host not in LOOPBACK:
            raise UsageError(f"--host {args.host} is beyond loopback: give --tokens FILE (or KEEL_TOKENS_FILE), "
                             f"the tokens file of `keel serve`, so that each person sees only their tenant")
        for tenant in args.tenant:
            Identity(tenant)            # a bad tenant name is a usage error here, not a broken link later
        return None
    if args.agent or args.task:
        raise UsageError("with --tokens the agent and task come from each token; drop --agent/--task")
    if len(args.tenant) > 1:
        raise UsageError("with --tokens, --tenant T accepts only T's tokens: give it once")
    return TokenTable.load(path, tenant=args.tenant[0] if args.tenant else None)


def _open(args: argparse.Namespace) -> dict[str, Graph]:
    """Each cartridge's graph: the events file in the same position, or the Redis graph."""
    settings = settings_of(args)
    if args.events and args.redis:
        raise UsageError("give --events FILE (one per cartridge) or --redis URL, not both")
    if args.events and len(args.events) != len(args.cartridges):
        raise UsageError(f"{len(args.cartridges)} cartridge(s) and {len(args.events)} events file(s): give one "
                         f"--events FILE per cartridge, in the same order")
    if not args.events and not settings.redis_url:
        raise UsageError("give --events FILE (embedded) or --redis URL (or set KEEL_REDIS_URL)")
    cartridges = [load_cartridge(folder) for folder in args.cartridges]
    names = [c.name for c in cartridges]
    if len(set(names)) != len(names):
        raise UsageError(f"a cartridge is named twice: {', '.join(names)}")
    if args.keys and not args.events:
        raise UsageError("--keys decrypts events files; the Redis graph holds what the workers revealed")
    keys = keys_of(args)
    graphs: dict[str, Graph] = {}
    try:
        for i, cartridge in enumerate(cartridges):
            graphs[cartridge.name] = open_graph(cartridge, settings, args.events[i] if args.events else None,
                                                keys=keys)
    except BaseException:
        for graph in graphs.values():
            graph.close()
        raise
    return graphs


async def _serve(app: object, sock: socket.socket, table: TokenTable | None) -> None:
    """uvicorn on the bound socket until Ctrl-C or SIGTERM; no access log (URLs hold entity ids and queries).
    SIGHUP re-reads the tokens file, as it does for `keel serve`."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))  # type: ignore[arg-type]
    if table is not None:
        def reload() -> None:
            try:
                print(f"keel inspect: tokens file reloaded ({table.reload()} token(s))", file=sys.stderr, flush=True)
            except UsageError as e:
                print(f"keel inspect: tokens file NOT reloaded, the previous tokens stay: {e}", file=sys.stderr,
                      flush=True)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    await server.serve(sockets=[sock])
