"""The inspector: `keel inspect`, a read-only web page over a cartridge's graph (a plug-in above `keel`, like
`workers` and `tools_server`; keel never imports it, and it imports neither of them).

Modules: cli (the subcommand, the server), app (Starlette routes, tokens, rendering), views (page parts made
from the tools' results), chart (the bitemporal picture's geometry); templates/ (Jinja2, autoescaped) and
static/ (the stylesheet). Nothing is imported here, so other `keel` commands never load Starlette or Jinja2.
"""
