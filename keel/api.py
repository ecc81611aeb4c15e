"""The Python entry point: `keel.open(cartridge, events=... | redis=...)` → a Graph → `graph.tools(tenant=...)`.

It decides where the graph lives exactly as the `keel` commands do (keel.config.resolve: the arguments
given, then KEEL_* variables, then defaults; keel.connect.open_graph opens it). docs/python.md is its manual.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .cartridge import Cartridge, load_cartridge
from .config import resolve
from .connect import Graph, GraphSet, open_graph, open_graphs
from .errors import UsageError
from .keystore import open_key_file


def open(cartridge: str | Path | Cartridge, *, events: str | Path | None = None, redis: str | None = None,
         kafka: str | None = None, keys: str | Path | None = None) -> Graph:
    """Open a cartridge's graph: built in memory from an `events` file (embedded: annotate appends to that
    file), or the Redis graph the workers maintain (`redis` URL, else KEEL_REDIS_URL; annotate produces to
    the cartridge's topic at `kafka`, else KEEL_KAFKA_BOOTSTRAP, else 127.0.0.1:9092, and returns once a
    worker applied the note). Use it as a context manager, or call `close()`.

    KEEL_ALLOW_GLOBAL_NOTES and KEEL_APPLY_TIMEOUT apply as they do to the commands. Raises
    UsageError (no graph named, both named, a bad cartridge: CartridgeInvalid) or ServiceUnavailable (Redis
    cannot be reached). Bad lines of an events file are reported on stderr and skipped, as the CLI does.

    `keys`: the key file (docs/privacy.md) that decrypts a sealed events file's personal fields, under the
    master key of KEEL_MASTER_KEY or KEEL_MASTER_KEY_FILE; an erased data subject's fields read as the mask."""
    if events is not None and redis is not None:
        raise UsageError("give one of events= (a JSONL file, embedded) or redis= (a Redis URL), not both")
    settings = resolve({"redis": redis, "kafka": kafka})
    if events is None and not settings.redis_url:
        raise UsageError("give events= (a JSONL file, embedded) or redis= (a Redis URL), or set KEEL_REDIS_URL")
    loaded = cartridge if isinstance(cartridge, Cartridge) else load_cartridge(cartridge)
    return open_graph(loaded, settings, events, keys=None if keys is None else open_key_file(keys))


def open_several(cartridges: Sequence[str | Path | Cartridge], *, events: Sequence[str | Path] | None = None,
                 redis: str | None = None, kafka: str | None = None, keys: str | Path | None = None) -> GraphSet:
    """Open several cartridges' graphs of one place as one: `events`, one file per cartridge in the same order
    (embedded), or the Redis graph of each cartridge (`redis`, else KEEL_REDIS_URL). `graph.tools(tenant=...)`
    then answers over all of them (keel.tool_set.ToolSet; docs/semantics.md, "Several cartridges per tenant").
    The cartridges are checked together first: two showing the same entity type or relation name, or a
    relation to a cartridge not given, raise CartridgeInvalid. Otherwise as `open`."""
    if events is not None and redis is not None:
        raise UsageError("give one of events= (JSONL files, embedded) or redis= (a Redis URL), not both")
    if isinstance(cartridges, (str, Path)) or len(cartridges) < 2:
        raise UsageError("open_several takes a list of two or more cartridges; keel.open opens one")
    settings = resolve({"redis": redis, "kafka": kafka})
    if events is None and not settings.redis_url:
        raise UsageError("give events= (JSONL files, embedded) or redis= (a Redis URL), or set KEEL_REDIS_URL")
    loaded = [c if isinstance(c, Cartridge) else load_cartridge(c) for c in cartridges]
    graph = open_graphs(loaded, settings, events, keys=None if keys is None else open_key_file(keys))
    assert isinstance(graph, GraphSet)
    return graph
