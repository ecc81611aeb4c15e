"""deploy/grafana/keel-dashboard.json: every panel's query parses as PromQL (promql-parser) and names only series
Keel's processes export (read from their prometheus_client registries) or the names issue 22 adds in parallel
(support.metric_names.PENDING); every exported series family has a panel; panels use the dashboard's
Prometheus variable, have unique ids and do not overlap on the 24-column grid."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.metric_names import PENDING, exported, metric_names, pending_report

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "keel-dashboard.json"
FAMILY_SUFFIX = re.compile(r"_(total|created|bucket|count|sum)$")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_every_query_names_only_series_keel_exports(dashboard: dict[str, Any]) -> None:
    known = exported()
    missing = pending_report(known)
    print(f"{len(missing)} allowed name(s) not registered yet")
    unknown = {}
    for title, expr in queries(dashboard):
        names = metric_names(expr)                    # raises on a query that is not PromQL
        assert names, f"{title}: {expr} selects no series"
        if names - known - PENDING:
            unknown.setdefault(title, []).extend(sorted(names - known - PENDING))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            name = re.fullmatch(r"label_values\((\w+), *\w+\)", variable["definition"])
            assert name, variable["definition"]
            if name[1] not in known | PENDING:
                unknown.setdefault(f"${variable['name']}", []).append(name[1])
    assert unknown == {}


def test_every_exported_series_family_has_a_panel(dashboard: dict[str, Any]) -> None:
    shown = {FAMILY_SUFFIX.sub("", name) for _, expr in queries(dashboard) for name in metric_names(expr)}
    families = {FAMILY_SUFFIX.sub("", name) for name in exported() | PENDING}
    assert sorted(families - shown) == []


def test_panels_use_the_prometheus_variable_and_fit_the_grid(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert dashboard["uid"] and dashboard["title"] and dashboard.get("id") is None
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["refId"] and target["legendFormat"], panel["title"]
