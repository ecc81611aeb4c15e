"""The `keel` command line: outputs, --json, exit codes, bad lines reported and skipped."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keel.cli import main
from keel.errors import EXIT_UNAVAILABLE

ROOT = Path(__file__).resolve().parents[1]
FINANCE = ROOT / "cartridges" / "finance"
EVENTS = FINANCE / "events.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_context_json_is_the_tool_result(capsys) -> None:
    code, out, _ = run(capsys, "context", FINANCE, EVENTS, "debt:visa", "--at", "2026-09-15", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["entity"] == "debt:visa" and result["at"] == "2026-09-15T00:00:00Z"
    assert {f["predicate"]: f["value"] for f in result["facts"]}["balance_cop"] == 4_200_000


def test_history_human_output(capsys) -> None:
    code, out, _ = run(capsys, "history", FINANCE, EVENTS, "debt:visa", "--predicate", "balance_cop")
    assert code == 0
    assert "balance_cop=4200000 valid 2026-09-01 -> 2026-10-01" in out
    assert "balance_cop=3870000 valid 2026-10-01 -> open" in out


def test_search_related_and_known_at(capsys) -> None:
    assert "debt:visa" in run(capsys, "search", FINANCE, EVENTS, "visa")[1]
    code, out, _ = run(capsys, "related", FINANCE, EVENTS, "debt:visa", "owed_by", "--json")
    assert code == 0 and json.loads(out)["relations"][0]["object"] == "household:hogar-demo"
    code, out, _ = run(capsys, "context", FINANCE, EVENTS, "due:visa-2026-09", "--at", "2026-09-20",
                       "--known-at", "2026-10-01", "--json")
    assert {f["predicate"]: f["value"] for f in json.loads(out)["facts"]}["status"] == "pending"


def test_a_service_that_is_down_exits_3(capsys) -> None:
    code, _, err = run(capsys, "context", FINANCE, "--redis", "redis://127.0.0.1:1/0", "--tenant", "t", "debt:visa")
    assert code == EXIT_UNAVAILABLE == 3 and "Redis" in err and "127.0.0.1:1" in err


def test_query_commands_read_the_redis_graph_of_keel_redis_url(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_REDIS_URL", "redis://127.0.0.1:1/0")
    code, _, err = run(capsys, "context", FINANCE, "debt:visa", "--tenant", "t")
    assert code == EXIT_UNAVAILABLE and "127.0.0.1:1" in err            # it went to that Redis
    assert run(capsys, "context", FINANCE, EVENTS, "debt:visa")[0] == 0   # an events file still wins
    code, _, err = run(capsys, "digest", FINANCE, "--tenant", "t")
    assert code == EXIT_UNAVAILABLE and "127.0.0.1:1" in err


def test_exit_codes(capsys) -> None:
    code, _, err = run(capsys, "context", FINANCE, EVENTS, "debt:nope")
    assert code == 1 and "debt:nope" in err and "hogar-demo" in err
    assert run(capsys, "context", FINANCE, EVENTS, "not-an-entity")[0] == 2
    for command in ("context", "history", "related"):       # a type the cartridge lacks: usage, types listed
        code, _, err = run(capsys, command, FINANCE, EVENTS, "truck:V-1")
        assert code == 2 and "use one of account, debt, due, household" in err
    assert run(capsys, "context", FINANCE, EVENTS, "debt:visa", "--at", "soon")[0] == 2
    assert run(capsys, "context", FINANCE, "missing.jsonl", "debt:visa")[0] == 2
    assert run(capsys, "history", FINANCE, EVENTS)[0] == 2
    with pytest.raises(SystemExit) as e:
        main(["context"])
    assert e.value.code == 2


def test_bad_lines_are_reported_with_line_number_and_skipped(tmp_path: Path, capsys) -> None:
    events = tmp_path / "events.jsonl"
    lines = EVENTS.read_text().splitlines()
    lines.insert(2, '{"id": "broken", "tenant": "hogar-demo", ')
    lines.insert(3, json.dumps({"id": "odd-1", "tenant": "hogar-demo", "type": "debt.exploded",
                                "subject": "debt:visa", "occurred_at": "2026-09-02", "payload": {}}))
    lines.insert(4, json.dumps({"id": "odd-2", "tenant": "hogar-demo", "type": "due.scheduled",
                                "subject": "due:x", "occurred_at": "2026-09-02",
                                "payload": {"debt_id": "visa", "due_on": "someday", "amount_cop": "lots",
                                            "color": "red"}}))
    events.write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "context", FINANCE, events, "debt:visa", "--json")
    assert code == 0 and json.loads(out)["entity"] == "debt:visa"
    assert f"{events}:line 3: event broken: not valid JSON (EOF while parsing a value)" in err
    assert "line 4: event odd-1: unknown event type 'debt.exploded'" in err
    assert "line 5: event odd-2:" in err and "payload.due_on: expected date" in err
    assert "payload.amount_cop: expected number" in err and "payload.color: unknown field" in err


def test_annotate_appends_to_the_events_file(tmp_path: Path, capsys) -> None:
    events = tmp_path / "events.jsonl"
    shutil.copyfile(EVENTS, events)
    code, out, _ = run(capsys, "annotate", FINANCE, events, "debt:visa", "next_step", "call the bank",
                       "--scope", "task", "--task", "t1", "--agent", "debts", "--evidence", "snap-visa-2026-10", "--json")
    assert code == 0 and json.loads(out)["fact"]["value"] == "call the bank"
    last = json.loads(events.read_text().splitlines()[-1])
    assert last["type"] == "keel.annotated" and last["payload"]["task"] == "t1"
    code, _, err = run(capsys, "annotate", FINANCE, events, "debt:visa", "x", "1", "--scope", "tenant")
    assert code == 1 and "evidence" in err
    code, out, _ = run(capsys, "history", FINANCE, events, "debt:visa", "--predicate", "next_step",
                       "--task", "t1", "--json")
    assert [v["value"] for v in json.loads(out)["versions"]] == ["call the bank"]


def test_validate(tmp_path: Path, capsys) -> None:
    assert run(capsys, "validate", FINANCE, "--events", EVENTS)[0] == 0
    bad = tmp_path / "bad"
    shutil.copytree(FINANCE, bad)
    (bad / "cartridge.yaml").write_text((FINANCE / "cartridge.yaml").read_text()
                                        .replace("owed_by: {from: debt, to: household}",
                                                 "owed_by: {from: debt, to: family}")
                                        .replace("ttl: {tenant: never", "ttl: {tenant: forever"))
    (bad / "handlers.py").write_text('from keel import Registry\n\nregistry = Registry()\n\n\n'
                                     '@registry.on("debt.closed")\ndef closed(event, store):\n    pass\n')
    code, _, err = run(capsys, "validate", bad)
    assert code == 2
    assert "relations.owed_by.to: 'family' is not a declared entity type" in err
    assert "memory.ttl.tenant" in err and "'debt.closed'" in err


def test_digest_is_stable(capsys) -> None:
    a = run(capsys, "digest", FINANCE, "--events", EVENTS)[1]
    b = run(capsys, "digest", FINANCE, "--events", EVENTS)[1]
    assert a == b and a.startswith("sha256:")


def test_demo_tells_the_story() -> None:
    done = subprocess.run([sys.executable, "-m", "keel.cli", "demo"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "3,870,000 COP" in done.stdout and "4,200,000 COP" in done.stdout
    assert "verdict: holds=true  because snap-visa-2026-10" in done.stdout
    assert "due:visa-2026-11" in done.stdout and "pending" in done.stdout
    assert "at 2026-11-05: holds=false" in done.stdout and "at 2026-11-06: holds=true" in done.stdout
    assert "annotate -> next_step (scope task" in done.stdout
    assert EVENTS.read_text().count("keel.annotated") == 0   # the demo never touches the sample stream


def test_a_refused_note_leaves_the_events_file_as_it_was(tmp_path: Path, capsys) -> None:
    """Issue 21's reproduction: a multibyte note over the byte limit was appended, then refused (exit 1), and
    `validate --events` exited 2 from then on."""
    events = tmp_path / "events.jsonl"
    shutil.copyfile(EVENTS, events)
    before = events.read_bytes()
    code, _, err = run(capsys, "annotate", FINANCE, events, "debt:visa", "memo", "東" * 1400, "--scope", "task",
                       "--task", "t")
    assert code == 2 and "4096 bytes" in err
    assert events.read_bytes() == before
    assert run(capsys, "validate", FINANCE, "--events", events)[0] == 0


def test_every_command_takes_the_events_file_both_ways(capsys) -> None:
    """Issue 21: the query commands took the events file as an argument, validate and digest only as --events."""
    assert run(capsys, "validate", FINANCE, EVENTS)[:2] == run(capsys, "validate", FINANCE, "--events", EVENTS)[:2]
    assert run(capsys, "validate", FINANCE, EVENTS)[0] == 0
    digests = {run(capsys, "digest", FINANCE, EVENTS)[1], run(capsys, "digest", FINANCE, "--events", EVENTS)[1]}
    assert len(digests) == 1 and digests.pop().startswith("sha256:")
    for argv in (["context", FINANCE, "{}", "debt:visa"], ["history", FINANCE, "{}", "debt:visa"],
                 ["search", FINANCE, "{}", "visa"], ["related", FINANCE, "{}", "debt:visa", "owed_by"]):
        positional = run(capsys, *[str(EVENTS) if a == "{}" else a for a in argv], "--json")
        flag = run(capsys, *[a for a in argv if a != "{}"], "--events", EVENTS, "--json")
        assert positional[0] == flag[0] == 0 and positional[1] == flag[1], argv
    assert run(capsys, "related", FINANCE, "debt:visa", "--events", EVENTS, "owed_by")[0] == 0  # words after it
    code, _, err = run(capsys, "validate", FINANCE, EVENTS, "--events", "other.jsonl")
    assert code == 2 and "two events files" in err
    code, _, err = run(capsys, "context", FINANCE, "--events", EVENTS, "--redis", "redis://127.0.0.1:1/0", "debt:visa")
    assert code == 2 and "--events FILE or --redis URL" in err


def test_validate_counts_the_files_lines(tmp_path: Path, capsys) -> None:
    """Issue 21: "10 bad line(s) of 57" counted distinct envelopes (applied + rejected) of a 59-line file."""
    events = tmp_path / "events.jsonl"
    lines = EVENTS.read_text().splitlines()
    events.write_text("\n".join([*lines, lines[0], "", '{"id": "broken"', lines[1]]) + "\n")   # 17 + 4 lines
    code, _, err = run(capsys, "validate", FINANCE, events)
    assert code == 2 and f"{events}: 1 bad line(s) of 21" in err


def test_a_default_kafka_address_is_named_once_on_stderr(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Issue 40: `keel status` without KEEL_KAFKA_BOOTSTRAP quietly read 127.0.0.1:9092, whoever's broker that is.
    The address a command uses is named on stderr when it came from the default, the first time it is used."""
    import keel.config
    from keel.config import resolve
    monkeypatch.setattr(keel.config, "_named", set())
    monkeypatch.delenv("KEEL_KAFKA_BOOTSTRAP", raising=False)
    settings = resolve({})
    assert capsys.readouterr().err == ""                  # resolving says nothing: only a use of the address does
    assert settings.kafka_bootstrap == settings.kafka_bootstrap == "127.0.0.1:9092"
    assert capsys.readouterr().err == ("keel: using Kafka at 127.0.0.1:9092 (default; set KEEL_KAFKA_BOOTSTRAP or "
                                       "pass --kafka)\n")
    monkeypatch.setattr(keel.config, "_named", set())
    assert resolve({"kafka": "10.0.0.5:9092"}).kafka_bootstrap == "10.0.0.5:9092"
    assert resolve({}, env={"KEEL_KAFKA_BOOTSTRAP": "10.0.0.6:9092"}).kafka_bootstrap == "10.0.0.6:9092"
    assert capsys.readouterr().err == ""
    assert resolve({}, env={"KEEL_KAFKA_BOOTSTRAP": ""}).kafka_bootstrap == "127.0.0.1:9092"   # empty: not set
    assert "using Kafka at 127.0.0.1:9092 (default" in capsys.readouterr().err
