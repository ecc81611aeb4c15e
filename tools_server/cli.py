"""Subcommands this package adds to `keel` (entry point `tools_server` of the group `keel.commands`): serve, tools, token.

Heavy imports (the MCP SDK) happen inside the commands, so other `keel` commands stay fast.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from functools import partial

from keel.commandline import add_events_arguments, events_of, pick_tenant
from keel.errors import EXIT_UNAVAILABLE, UsageError
from keel.logs import add_log_arguments, log_format, setup_logging

from .config import CALL_LOGGER, DEFAULT_HOST, DEFAULT_PORT, HTTP_ENV, MCP_PATH, HttpOptions, Identity


def register(sub: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the `keel` parser."""
    p = sub.add_parser(
        "serve", help="serve the five tools over MCP (stdio or streamable HTTP)",
        description="Serve context, history, search, annotate and related over MCP. Stdio binds the caller "
                    "with --tenant/--agent/--task; HTTP binds each caller by bearer token (--tokens).")
    p.add_argument("cartridge", help="cartridge folder, or several separated by commas (one tool set over all)")
    p.add_argument("--tenant", help="stdio: the tenant served (default: the only one in the events file); "
                                    "http: serve only this tenant's tokens")
    add_events_arguments(p, "embedded: replay this events file; notes are appended to it")
    p.add_argument("--keys", metavar="FILE", help="embedded: the key file that decrypts a sealed events file's "
                                                  "personal fields (docs/privacy.md; master key from KEEL_MASTER_KEY)")
    p.add_argument("--redis", metavar="URL", help="read the Redis graph the workers maintain (env KEEL_REDIS_URL)")
    p.add_argument("--kafka", metavar="BOOTSTRAP", help="with --redis: where annotate produces its events "
                                                        "(env KEEL_KAFKA_BOOTSTRAP)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default stdio")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"http: bind address (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"http: port (default {DEFAULT_PORT})")
    p.add_argument("--agent", help="stdio: the caller's agent id (owner of agent-scope notes)")
    p.add_argument("--task", help="stdio: the caller's task id (task-scope notes)")
    p.add_argument("--tokens", metavar="FILE", help="http: bearer tokens file (env KEEL_TOKENS_FILE); "
                                                    "make entries with `keel token`")
    p.add_argument("--issuer", action="append", default=[], metavar="URL",
                   help="http: accept OAuth access tokens (JWT) of this authorization server; repeatable "
                        "(env KEEL_OAUTH_ISSUER, space-separated); works beside --tokens")
    p.add_argument("--resource", metavar="URL", help="http, OAuth: this server's public URL, the audience tokens "
                                                     "must name (env KEEL_OAUTH_RESOURCE; default http://HOST:PORT/mcp)")
    p.add_argument("--tenant-claim", default="tenant", metavar="NAME", help="OAuth: the claim naming the tenant "
                                                                             "(default tenant)")
    p.add_argument("--agent-claim", action="append", metavar="NAME",
                   help="OAuth: the claim naming the agent; repeatable, the first present wins "
                        "(default azp, client_id, sub)")
    p.add_argument("--task-claim", default="task", metavar="NAME", help="OAuth: the claim naming the task "
                                                                         "(optional in tokens; default task)")
    p.add_argument("--oauth-algorithms", metavar="LIST", help="OAuth: comma-separated signing algorithms accepted "
                                                               "(default RS256..512, PS256..512, ES256..512, EdDSA)")
    p.add_argument("--oauth-leeway", type=float, default=30.0, metavar="SECONDS",
                   help="OAuth: clock skew allowed for exp/nbf (default 30)")
    p.add_argument("--allow-host", action="append", default=[], metavar="H",
                   help="http: also accept this Host (NAME[:PORT]) or Origin (http(s)://NAME[:PORT]); repeatable; "
                        "for deployments behind a proxy")
    p.add_argument("--allow-global-notes", action="store_true", default=None,
                   help="operator switch: allow notes in global scope (env KEEL_ALLOW_GLOBAL_NOTES)")
    p.add_argument("--sse", action="store_true", help="http: answer tool calls as SSE streams instead of JSON bodies")
    d, env = HttpOptions(), HTTP_ENV
    p.add_argument("--stateless", action="store_true", default=None,
                   help=f"http: no MCP sessions, every request stands alone, so several servers can sit behind a "
                        f"load balancer (env {env['stateless']})")
    p.add_argument("--session-idle-timeout", type=float, metavar="SECONDS",
                   help=f"http: close a session after this long without a request; its id then gets 404 and the "
                        f"client starts a new one (default {d.session_idle_timeout:g}, env {env['session_idle_timeout']})")
    p.add_argument("--max-sessions", type=int, metavar="N",
                   help=f"http: open sessions at most; one more gets 503 (default {d.max_sessions}, "
                        f"env {env['max_sessions']})")
    p.add_argument("--header-timeout", type=float, metavar="SECONDS",
                   help=f"http: close a connection that has not sent a whole request this long after connecting "
                        f"or after starting it (default {d.header_timeout:g}, env {env['header_timeout']})")
    p.add_argument("--calls-in-flight", type=int, metavar="N",
                   help=f"http: requests one token may have in flight; more get 429 with Retry-After "
                        f"(default {d.calls_in_flight}, env {env['calls_in_flight']})")
    p.add_argument("--calls-per-second", type=int, metavar="N",
                   help=f"http: requests one token may send a second (bursts up to N); more get 429 with "
                        f"Retry-After (default {d.calls_per_second}, env {env['calls_per_second']})")
    p.add_argument("--no-call-log", action="store_true", help="do not write the log line per call on stderr")
    p.add_argument("--audit", metavar="FILE|kafka",
                   help="append an audit record of every tool call to this JSON-lines file, or with `kafka` to the "
                        "topic keel.<cartridge>.audit (env KEEL_AUDIT_LOG; `keel audit show|replay ID`)")
    add_log_arguments(p)
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser("tools", help="print the MCP tool surface and its size in tokens",
                       description="Print the five tools as tools/list returns them and their approximate "
                                   "size in tokens (characters / 4).")
    p.add_argument("--json", action="store_true", help="print the tools/list JSON (size on stderr)")
    p.set_defaults(run=cmd_tools)

    p = sub.add_parser("token", help="make a bearer token for `keel serve --transport http`",
                       description="Print a new random token on stdout and the tokens-file line binding its "
                                   "sha256 to a tenant (and agent, task). With --tokens the line is appended to "
                                   "that file instead; the file never holds the token itself.")
    p.add_argument("--tenant", required=True, help="the tenant the token may read and write")
    p.add_argument("--agent", help="the agent id of the token's holder")
    p.add_argument("--task", help="the task id of the token's holder")
    p.add_argument("--tokens", metavar="FILE", help="append the line to this tokens file (created mode 0644: "
                                                    "it holds only sha256 digests, and the server's container "
                                                    "user must read it)")
    p.add_argument("--stdin", action="store_true", help="hash a token read from stdin instead of making one")
    p.set_defaults(run=cmd_token)


def cmd_serve(args: argparse.Namespace) -> int:
    from .config import ServerConfig, http_options
    from .http import run_server
    from .server import build_server

    setup_logging(log_format(args.log_format))
    backend = _open_backend(args)
    backend.audit = open_audit(args, backend.name)
    log = None if args.no_call_log else call_logger()
    try:
        if args.transport == "stdio":
            if args.tokens or args.issuer:
                raise UsageError("--tokens and --issuer are for --transport http; stdio binds the caller with "
                                 "--tenant/--agent/--task")
            identity = Identity(pick_tenant(args.tenant, backend.tenants), args.agent, args.task)
            warn_empty_tenants(backend, [identity.tenant])
            server = build_server(ServerConfig(backend, identity=identity, call_log=log))
            run_server(server.run_stdio_async)
            return 0
        from keel.sockets import bind_socket

        from .http import serve_http
        from .tokens import TokenTable, tokens_path
        path = tokens_path(args.tokens)
        oauth = _oauth_settings(args)
        if not path and oauth is None:
            raise UsageError("HTTP binds callers by bearer token: give --tokens FILE or KEEL_TOKENS_FILE "
                             "(make one with `keel token --tenant T --tokens FILE`), or --issuer URL for OAuth")
        if args.agent or args.task:
            raise UsageError("on HTTP the agent and task come from each token; drop --agent/--task")
        table = TokenTable.load(path, tenant=args.tenant) if path else None
        opts = http_options(vars(args))
        config = ServerConfig(backend, tokens=table, oauth=oauth, host=args.host, port=args.port,
                              allow_hosts=tuple(args.allow_host), call_log=log, http=opts)
        server = build_server(config)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        say = logging.getLogger("keel.serve")
        try:
            sock = bind_socket(args.host, args.port)      # before any success line: a busy port is one clear line
        except OSError as e:
            say.error(f"cannot listen on {shown}:{args.port}: {e.strerror or e} (another server on this port? "
                      f"pick another with --port)")
            return EXIT_UNAVAILABLE
        if table is not None:
            warn_empty_tenants(backend, table.tenants())
        elif args.tenant:
            warn_empty_tenants(backend, [args.tenant])
        bound = [f"{len(table)} token(s)"] if table is not None else []
        if oauth is not None:
            bound.append(f"OAuth: {', '.join(oauth.issuers)} for {oauth.resource}")
        say.info(f"http://{shown}:{args.port}{MCP_PATH} ({'; '.join(bound)}); /metrics, /healthz, /readyz")
        sessions = ("stateless (no sessions)" if opts.stateless else f"sessions close after "
                    f"{opts.session_idle_timeout:g} s idle, at most {opts.max_sessions}")
        say.info(f"{sessions}; per token at most {opts.calls_in_flight} calls in flight and "
                 f"{opts.calls_per_second} a second (429 beyond); requests within {opts.header_timeout:g} s")
        if args.host not in ("127.0.0.1", "localhost", "::1") and not args.allow_host:
            say.warning(f"bound to {args.host}: requests are refused unless their Host is loopback; "
                        f"pass --allow-host NAME for the names clients use")
        run_server(partial(serve_http, server, config, json_response=not args.sse, sock=sock))
        return 0
    finally:
        backend.close()


def _oauth_settings(args: argparse.Namespace):  # -> OAuthSettings | None (imported lazily)
    """OAuth settings from the serve flags and KEEL_OAUTH_*; None when no issuer is given."""
    from keel.oauth import ALGORITHMS, ClaimNames, oauth_settings
    if args.transport != "http":
        return None
    algorithms = tuple(a.strip() for a in args.oauth_algorithms.split(",") if a.strip()) \
        if args.oauth_algorithms else ALGORITHMS
    if not args.oauth_leeway >= 0:
        raise UsageError(f"bad --oauth-leeway {args.oauth_leeway!r}: seconds, 0 or more")
    claims = ClaimNames(tenant=args.tenant_claim, agent=tuple(args.agent_claim or ClaimNames().agent),
                        task=args.task_claim)
    return oauth_settings(args.issuer, args.resource, host=args.host, port=args.port, algorithms=algorithms,
                          leeway=args.oauth_leeway, claims=claims,
                          tenants=frozenset([args.tenant]) if args.tenant else None)


def open_audit(args: argparse.Namespace, cartridge: str):  # -> keel.audit.AuditWriter | None
    """The audit log of `--audit FILE|kafka` (else KEEL_AUDIT_LOG); None when neither is given."""
    import os

    from keel.audit import AuditFile
    from keel.commandline import settings_of
    where = args.audit or os.environ.get("KEEL_AUDIT_LOG", "").strip()
    if where == "kafka":
        from keel.kafka_audit import AuditTopic
        return AuditTopic(cartridge, settings_of(args))
    return AuditFile(where) if where else None


def warn_empty_tenants(backend, tenants: list[str]) -> None:  # backend: Backend (imported lazily)
    """One warning line per served tenant that has no events yet (its calls answer "unknown tenant")."""
    for tenant in sorted(set(tenants)):
        if not backend.has_tenant(tenant):
            logging.getLogger("keel.serve").warning(f"tenant {tenant!r} has no events yet; its calls answer "
                                                    f"'unknown tenant' until some are applied")


def _open_backend(args: argparse.Namespace):  # -> Backend (imported lazily)
    from keel.cartridge_set import load_cartridges
    from keel.commandline import keys_of, settings_of
    from keel.connect import open_graphs

    from .backend import Backend

    cartridges = load_cartridges(args.cartridge)
    settings = settings_of(args)
    events = events_of(args)
    if events and args.redis:
        raise UsageError("give one of an events file (or --events FILE) or --redis URL")
    if not events and not settings.redis_url:
        raise UsageError("give an events file (or --events FILE; embedded) or --redis URL (or set KEEL_REDIS_URL)")
    if args.keys and not events:
        raise UsageError("--keys decrypts an events file; the Redis graph holds what the workers revealed")
    return Backend.of(open_graphs(cartridges, settings, events, keys=keys_of(args)), settings)


def call_logger() -> logging.Logger:
    """The logger of the per-call lines (formatted by keel.logs like every other line of the process)."""
    log = logging.getLogger(CALL_LOGGER)
    log.setLevel(logging.INFO)
    return log


def cmd_tools(args: argparse.Namespace) -> int:
    from .surface import SPECS, TOKEN_GOAL, approx_tokens, tools_json

    compact = tools_json(indent=None)
    size = (f"tools/list: {len(SPECS)} tools, {len(compact)} characters ≈ {approx_tokens(compact)} tokens "
            f"(goal ≤ {TOKEN_GOAL})")
    if args.json:
        print(tools_json())
        print(size, file=sys.stderr)
        return 0
    for spec in SPECS:
        hints = "read-only, closed world" if spec.annotations.read_only_hint else "writes a note"
        print(f"{spec.name}  ({hints})")
        print(f"  {spec.description}")
        required = set(spec.input_schema.get("required", ()))
        for name, schema in spec.input_schema["properties"].items():
            mark = "" if name in required else "?"
            print(f"    {name}{mark}: {schema.get('description', '')}")
        print()
    print(size)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from .tokens import append_entry, new_token, token_entry

    identity = Identity(args.tenant, args.agent, args.task)
    if args.stdin:
        token = sys.stdin.readline().strip()
        if not token:
            raise UsageError("--stdin: no token on stdin")
    else:
        token = new_token()
    if args.tokens:
        warning = append_entry(args.tokens, token_entry(token, identity))
        if not args.stdin:
            print(token)
        print(f"keel token: added a token of tenant {identity.tenant!r} to {args.tokens}", file=sys.stderr)
        if warning:
            print(f"keel token: warning: {warning}", file=sys.stderr)
    else:
        if not args.stdin:
            print(token)
        print(json.dumps(token_entry(token, identity), separators=(",", ":")))
    return 0
