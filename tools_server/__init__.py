"""The MCP read side: the five tools over stdio or streamable HTTP (the only package importing the MCP SDK).

    from tools_server.server import build_server      # build_server(ServerConfig(...)) -> MCPServer
    from tools_server.config import ServerConfig, Identity
    from tools_server.backend import Backend

Modules: surface (the tool list as data), server (the factory), calls (one call: Tools, errors,
observation), backend (store, log, Tools per identity), auth (bearer tokens), http (transport, Host/Origin,
/metrics, request deadline, session memory), throttle (per-token limits, responses by status), fastpath
(stateless tools/call without the SDK's per-request transport), observe (JSON call log, Prometheus text), cli
(`keel serve|tools|token`).
Nothing is imported here, so `keel` commands that do not serve never load the SDK.
"""
