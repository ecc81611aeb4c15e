"""`keel publish` without Kafka: what it would send (canonical envelopes keyed by tenant) and what it rejects."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.workers import CARTRIDGES, ROOT, embedded_digests

from keel.cartridge import load_cartridge
from keel.cli import main
from keel.errors import EXIT_UNAVAILABLE
from workers.publish import prepare


@pytest.mark.parametrize("name", CARTRIDGES)
def test_the_published_form_builds_the_same_graph_as_the_file(name: str, tmp_path: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    source = ROOT / "cartridges" / name / "events.jsonl"
    prepared = prepare(cartridge, source)
    assert not prepared.rejected
    published = tmp_path / "published.jsonl"
    published.write_bytes(b"".join(value + b"\n" for _, value in prepared.records))
    assert embedded_digests(cartridge, published) == embedded_digests(cartridge, source)
    for key, value in prepared.records:
        envelope = json.loads(value)
        assert key == envelope["tenant"].encode()
        assert envelope["recorded_at"] and envelope["source"]      # filled as file mode reads them


def test_bad_lines_are_reported_with_line_numbers_and_not_sent(tmp_path: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    lines = (ROOT / "cartridges" / "finance" / "events.jsonl").read_text().splitlines()
    bad = [lines[0], "{oops", "", json.dumps({**json.loads(lines[1]), "type": "debt.lost"}), lines[2]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(bad) + "\n")
    seen = []
    prepared = prepare(cartridge, path, on_reject=seen.append)
    assert [(r.line, r.event_id) for r in prepared.rejected] == [(2, None), (4, json.loads(lines[1])["id"])]
    assert "not valid JSON" in prepared.rejected[0].reason
    assert "unknown event type 'debt.lost'" in prepared.rejected[1].reason
    assert seen == prepared.rejected
    assert [json.loads(v)["id"] for _, v in prepared.records] == [json.loads(lines[i])["id"] for i in (0, 2)]


def test_publish_reports_an_unreachable_kafka_without_a_traceback(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["publish", str(ROOT / "cartridges" / "finance"), str(ROOT / "cartridges" / "finance" / "events.jsonl"),
                 "--kafka", "127.0.0.1:1", "--quiet"])
    assert code == EXIT_UNAVAILABLE          # a service is down: neither a domain (1) nor a usage (2) error
    assert "Kafka" in capsys.readouterr().err


def test_publish_needs_an_existing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", str(ROOT / "cartridges" / "finance"), "/nonexistent/events.jsonl"]) == 2
    assert "/nonexistent/events.jsonl" in capsys.readouterr().err


def test_publish_takes_the_events_file_in_either_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21: every command that reads an events file takes it as an argument or as --events."""
    finance = str(ROOT / "cartridges" / "finance")
    events = str(ROOT / "cartridges" / "finance" / "events.jsonl")
    assert main(["publish", finance, "--events", events, "--kafka", "127.0.0.1:1", "--quiet"]) == EXIT_UNAVAILABLE
    assert main(["publish", finance, "--events", "/nonexistent/a.jsonl"]) == 2
    assert "/nonexistent/a.jsonl" in capsys.readouterr().err
    assert main(["publish", finance, events, "--events", "/nonexistent/a.jsonl"]) == 2
    assert "two events files" in capsys.readouterr().err
    assert main(["publish", finance]) == 2
    assert "give the events file" in capsys.readouterr().err
