"""The inspector's web application (Starlette): read-only pages rendered by Jinja2 from the tools' results.

Routes (every page is a GET; the URL holds the view, so it can be shared):

    /                                              cartridges and tenants to pick
    /go?cartridge=C&tenant=T                       → the tenant's page (the picker's form)
    /c/<cartridge>/t/<tenant>?q=…&at=…&known_at=…  search (the `search` tool)
    /c/<cartridge>/t/<tenant>/e/<entity>?at=…&known_at=…   the entity view (context, history)
    /static/inspector.css, /healthz
    /login (GET form, POST token), /logout (POST): only when tokens are required

Every answer comes from `Graph.tools(tenant, agent, task)`, the path of the CLI and the MCP server; annotate is
never called. With a tokens file the caller is the token's identity and sees only its tenant (401 without a
token, 403 for another tenant); without one (loopback only) the caller is the tenant picked, with the
--agent/--task given to `keel inspect`. Host headers outside the allowed names are refused (DNS rebinding).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from keel.connect import Graph
from keel.errors import KeelError, ServiceUnavailable, UnknownEntity, UnknownTenant, UsageError
from keel.identifiers import TENANT
from keel.times import Micros, now_micros
from keel.tokens import Identity, TokenTable
from keel.tools import Tools

from .views import FILTERS, Place, Times, entity_view, search_hits

COOKIE = "keel_inspect_token"
MAX_PARAM = 256                 # characters of a query parameter (a time, a query) the page passes on
MAX_FORM = 4096                 # bytes of the login form
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",            # URLs hold entity ids and queries: never sent elsewhere
    "Cache-Control": "no-store",
}


@dataclass
class Options:
    """How the pages are served: who the caller is, which tenants the picker lists, which Host names pass."""
    tokens: TokenTable | None = None            # None: no token asked (loopback without --tokens)
    agent: str | None = None                    # without tokens: whose agent notes the pages show
    task: str | None = None
    tenants: list[str] = field(default_factory=list)     # named with --tenant (the Redis graph lists none)
    hosts: list[str] = field(default_factory=lambda: ["127.0.0.1", "localhost", "::1"])
    clock: Callable[[], Micros] = now_micros


class Refused(Exception):
    """A request answered with a page other than the one asked for (login, forbidden, not found)."""

    def __init__(self, response: Response) -> None:
        self.response = response


class Inspector:
    """The pages of one `keel inspect` process over its opened graphs (cartridge name → Graph)."""

    def __init__(self, graphs: dict[str, Graph], options: Options) -> None:
        self.graphs = graphs
        self.options = options
        self.env = Environment(loader=PackageLoader("inspector", "templates"), autoescape=True,
                               undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self.env.filters.update(FILTERS)
        self.css = files("inspector").joinpath("static", "inspector.css").read_bytes()

    # ---- the application ----------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [
            Route("/", self.guarded(self.index)),
            Route("/go", self.guarded(self.go)),
            Route("/c/{cartridge}/t/{tenant}", self.guarded(self.tenant_page)),
            Route("/c/{cartridge}/t/{tenant}/e/{entity}", self.guarded(self.entity_page)),
            Route("/static/inspector.css", self.stylesheet),
            Route("/healthz", self.healthz),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
        ]
        return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware,
                                                               allowed_hosts=self.options.hosts)])

    def guarded(self, page: Callable[[Request, Identity | None], Response]) -> Callable[[Request], Response]:
        """A page behind the token check, Keel's errors shown as pages with their status (sync: Starlette runs it
        on a thread, so a tool call on Redis never blocks the event loop). Anything else is a bug: Starlette
        answers 500 without details."""
        def endpoint(request: Request) -> Response:
            try:
                return page(request, self.caller(request))
            except Refused as e:
                return e.response
            except (UnknownEntity, UnknownTenant) as e:
                return self.render_error(404, "Not found", str(e))
            except UsageError as e:
                return self.render_error(400, "Bad request", str(e))
            except ServiceUnavailable as e:
                return self.render_error(503, "Service unavailable", str(e))
            except KeelError as e:
                return self.render_error(400, "Refused", str(e))
        endpoint.__name__ = page.__name__
        return endpoint

    # ---- who is asking ---------------------------------------------------------------------

    def caller(self, request: Request) -> Identity | None:
        """The token's identity when tokens are required (else None: the pages use the tenant picked)."""
        table = self.options.tokens
        if table is None:
            return None
        token = _bearer(request) or request.cookies.get(COOKIE, "")
        found = table.lookup(token) if token else None
        if found is None:
            raise Refused(self.render(request, "login.html", 401, message="Sign in with a bearer token from "
                                      "the tokens file (`keel token --tenant T --tokens FILE` makes one)."))
        return found[1]

    def tools_for(self, cartridge: str, tenant: str, who: Identity | None) -> Tools:
        """The five tools for this page's caller: the token's identity, else the tenant picked with --agent/--task."""
        graph = self.graph(cartridge)
        if not TENANT.fullmatch(tenant):
            raise UsageError(f"bad tenant {tenant[:80]!r}")
        if who is not None and who.tenant != tenant:
            raise Refused(self.render_error(403, "Forbidden", "this token is bound to another tenant"))
        if who is not None:
            return graph.tools(tenant=tenant, agent=who.agent, task=who.task)
        return graph.tools(tenant=tenant, agent=self.options.agent, task=self.options.task)

    def graph(self, cartridge: str) -> Graph:
        graph = self.graphs.get(cartridge)
        if graph is None:
            raise Refused(self.render_error(404, "Not found", "no such cartridge in this inspector"))
        return graph

    # ---- pages ----------------------------------------------------------------------------

    def index(self, request: Request, who: Identity | None) -> Response:
        listed = []
        for name, graph in self.graphs.items():
            if who is not None:
                tenants = [who.tenant]
            else:
                tenants = sorted(set(graph.tenants or []) | set(self.options.tenants))
            listed.append({"name": name, "tenants": [(t, Place(name, t).home) for t in tenants],
                           "embedded": graph.embedded})
        return self.render(request, "index.html", cartridges=listed, typed=who is None)

    def go(self, request: Request, who: Identity | None) -> Response:
        cartridge, tenant = _param(request, "cartridge"), _param(request, "tenant").strip()
        self.graph(cartridge)
        if not TENANT.fullmatch(tenant):
            raise UsageError("tenant: letters, digits and . _ - (at most 64, first a letter or digit)")
        return RedirectResponse(Place(cartridge, tenant).home, status_code=303)

    def tenant_page(self, request: Request, who: Identity | None) -> Response:
        cartridge, tenant = request.path_params["cartridge"], request.path_params["tenant"]
        tools = self.tools_for(cartridge, tenant, who)
        place, times = Place(cartridge, tenant), _times(request)
        query, kind = _param(request, "q"), _param(request, "type")
        result, hits = None, []
        if query.strip():
            result = tools.search(query, type=kind or None, limit=25, at=times.at or None,
                                  known_at=times.known_at or None)
            hits = search_hits(result, place, times)
        types = sorted(self.graph(cartridge).cartridge.spec.entities)
        return self.render(request, "tenant.html", place=place, times=times, query=query, kind=kind, types=types,
                           result=result, hits=hits)

    def entity_page(self, request: Request, who: Identity | None) -> Response:
        cartridge, tenant = request.path_params["cartridge"], request.path_params["tenant"]
        entity = request.path_params["entity"]
        tools = self.tools_for(cartridge, tenant, who)
        place, times = Place(cartridge, tenant), _times(request)
        context = tools.context(entity, at=times.at or None, known_at=times.known_at or None)
        history = tools.history(entity, known_at=times.known_at or None)
        everything = tools.history(entity) if times.known_at else history
        view = entity_view(context, history, everything, place, times, self.options.clock())
        return self.render(request, "entity.html", place=place, times=times, view=view, ctx=context,
                           now_link=view.now_link, types=sorted(self.graph(cartridge).cartridge.spec.entities),
                           query="", kind="")

    def stylesheet(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css", headers=HEADERS)

    def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok", headers=HEADERS)

    async def login(self, request: Request) -> Response:
        if self.options.tokens is None:
            return RedirectResponse("/", status_code=303)
        if request.method == "GET":
            return self.render(request, "login.html", 200, message="")
        if not _same_origin(request):
            return self.render_error(403, "Forbidden", "a sign-in from another site")
        body = await request.body()
        token = parse_qs(body[:MAX_FORM].decode("utf-8", "replace")).get("token", [""])[0].strip()
        if not token or self.options.tokens.lookup(token) is None:
            return self.render(request, "login.html", 401, message="That token is not in the tokens file.")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        if not _same_origin(request):
            return self.render_error(403, "Forbidden", "a sign-out from another site")
        response = RedirectResponse("/login" if self.options.tokens is not None else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # ---- rendering ------------------------------------------------------------------------

    def render(self, request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        values.setdefault("signed_in", self.options.tokens is not None and template != "login.html")
        html = self.env.get_template(template).render(**values)
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def render_error(self, status: int, title: str, message: str) -> HTMLResponse:
        html = self.env.get_template("error.html").render(status=status, title=title, message=message,
                                                         signed_in=self.options.tokens is not None)
        return HTMLResponse(html, status_code=status, headers=HEADERS)


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if len(value) > MAX_PARAM:
        raise UsageError(f"{name}: at most {MAX_PARAM} characters")
    return value


def _times(request: Request) -> Times:
    return Times(_param(request, "at").strip(), _param(request, "known_at").strip())


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _same_origin(request: Request) -> bool:
    """A form POST from this site: no Origin header (an older browser), or one naming the request's Host."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin.split("://", 1)[-1].rstrip("/") == request.headers.get("host", "")

