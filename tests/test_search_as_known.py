"""Search scores as known at `known_at`: BM25's corpus statistics (entities known, their average length) are those
known then, so the same question asked later as known at the same time answers the same bytes (issue 26: an
audited search is replayed byte for byte). Without `known_at` nothing changes."""
from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import keel
from keel.search import NEVER

FINANCE = Path(__file__).resolve().parents[1] / "cartridges" / "finance"
TENANT = "hogar-demo"


def snapshot(debt: str, creditor: str, product: str) -> dict:
    stamp = (datetime.now(UTC) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"id": f"snap-{debt}-later", "tenant": TENANT, "type": "debt.snapshot", "subject": f"debt:{debt}",
            "occurred_at": "2026-11-01", "recorded_at": stamp,
            "payload": {"creditor": creditor, "product": product, "balance_cop": 100000, "rate_ea_pct": 20.0,
                        "installment_cop": 10000, "month": "2026-11"}}


def ask(events: Path, **options: object) -> list[dict]:
    with keel.open(FINANCE, events=events) as graph:
        return graph.tools(tenant=TENANT).search("Visa Banco", **options)["results"]


def test_a_search_as_known_then_is_the_same_after_more_was_learnt(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    shutil.copy(FINANCE / "events.jsonl", events)
    with keel.open(FINANCE, events=events) as graph:
        known = graph.tools(tenant=TENANT).search("visa")["known_through"]
    before_now, before_known = ask(events), ask(events, known_at=known)
    assert before_now == before_known
    with events.open("a", encoding="utf-8") as f:          # entities and words learnt after `known`
        for i in range(5):
            f.write(json.dumps(snapshot(f"extra{i}", "Banco Lejano Visa Platino Oro", f"Visa Extra {i}")) + "\n")
    after_known = ask(events, known_at=known)
    assert json.dumps(after_known) == json.dumps(before_known)     # byte for byte
    after_now = ask(events)
    # the corpus moved: other entities rank there now (scores are fused ranks, so a position's score alone can stay)
    assert [r["entity"] for r in after_now[:len(before_now)]] != [r["entity"] for r in before_now]


def test_corpus_statistics_follow_knowledge_time() -> None:
    with keel.open(FINANCE, events=FINANCE / "events.jsonl") as graph:
        tools = graph.tools(tenant=TENANT)
        tools.search("visa")
        [(_, index)] = graph._indexes.values()
    n, avg = index.corpus(NEVER - 1)
    assert (n, avg) == (len(index.names), index.avg)                # now: the whole index, as before
    assert index.corpus(-NEVER)[0] == 0                             # before anything was known: nothing
    times = index.stat_times
    assert times == sorted(times) and all(0 < c[0] <= n for c in index.stat_counts)
