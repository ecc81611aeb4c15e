"""The five tools and the memory policy (who may write and read which notes) on the embedded store."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from keel import NoteRefused, Tools, UnknownEntity, UnknownTenant, UsageError, load_cartridge
from keel.embedded import build_embedded
from keel.eventlog import FileLog
from keel.times import parse_time

ROOT = Path(__file__).resolve().parents[1]
FINANCE = ROOT / "cartridges" / "finance"
T0 = parse_time("2026-11-30T12:00:00Z")
DAY = 86_400_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def env(tmp_path: Path):
    events = tmp_path / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", events)
    cartridge = load_cartridge(FINANCE)
    projector, _ = build_embedded(cartridge, events, allow_global_notes=True)
    clock = Clock()

    def make(agent: str | None = "a1", task: str | None = "t1", tenant: str = "hogar-demo", allow: bool = True) -> Tools:
        return Tools(cartridge, projector.store, tenant, agent=agent, task=task, log=FileLog(projector, events),
                     allow_global_notes=allow, clock=clock)
    return make, clock, events


def notes(ctx: dict) -> list[tuple[str, object, str]]:
    return [(f["predicate"], f["value"], f["scope"]) for f in ctx["facts"] if f["scope"]]


def test_context_shape_and_determinism(env) -> None:
    make, _, _ = env
    t = make()
    a = t.context("debt:visa", at="2026-09-15")
    assert list(a) == ["entity", "type", "ref", "labels", "at", "known_at", "facts", "relations", "rules",
                       "known_through"]
    assert a["at"] == "2026-09-15T00:00:00Z" and a["known_at"] is None
    assert list(a["facts"][0]) == ["predicate", "value", "valid_from", "valid_to", "recorded_at", "source",
                                   "evidence", "scope", "by", "expires_at", "corrected_by"]
    assert json.dumps(a) == json.dumps(make().context("debt:visa", at="2026-09-15"))


def test_unknown_entity_names_entity_and_tenant(env) -> None:
    make, _, _ = env
    with pytest.raises(UnknownEntity, match="debt:nope.*hogar-demo"):
        make().context("debt:nope")
    with pytest.raises(UnknownEntity):
        make().history("debt:nope")
    with pytest.raises(UnknownEntity):
        make().related("debt:nope")


@pytest.mark.parametrize("bad", ["visa", "debt:*", "debt:{x}", "debt:a b", ":x", "debt:" + "x" * 200, 5, None])
def test_hostile_entity_ids_are_usage_errors(env, bad) -> None:
    make, _, _ = env
    with pytest.raises(UsageError):
        make().context(bad)


def test_bad_times_and_arguments(env) -> None:
    make, _, _ = env
    t = make()
    with pytest.raises(UsageError, match="at"):
        t.context("debt:visa", at="yesterday")
    with pytest.raises(UsageError, match="limit"):
        t.search("visa", limit=0)
    with pytest.raises(UsageError, match="type"):
        t.search("visa", type="spaceship")
    with pytest.raises(UsageError):
        t.search("   ")


def test_search_ranks_and_guides_on_no_hits(env) -> None:
    make, _, _ = env
    t = make()
    r = t.search("Visa Banco Andino")
    assert r["results"][0]["entity"] == "debt:visa" and r["results"][0]["score"] > r["results"][1]["score"]
    assert [x["type"] for x in t.search("visa", type="due")["results"]] == ["due"] * 3
    assert t.search("visa", limit=1)["results"][0]["entity"] == "debt:visa"
    miss = t.search("zebra unicorn")
    assert miss["results"] == [] and "broader" in miss["message"]
    assert t.search("crédito andino")["results"][0]["entity"] == "debt:visa"  # accents fold, any word hits


def test_search_is_per_tenant(env) -> None:
    make, _, _ = env
    with pytest.raises(UnknownTenant, match="other-home"):     # a tenant nothing is known about is reported
        make(tenant="other-home").search("visa")


def test_annotate_visibility_by_scope(env) -> None:
    make, _, events = env
    a1, a2, t2 = make("a1", "t1"), make("a2", "t1"), make("a3", "t2")
    a1.annotate("debt:visa", "mine", "agent note", "agent")
    a1.annotate("debt:visa", "ours", "task note", "task")
    a1.annotate("debt:visa", "everyone", "tenant note", "tenant", evidence="snap-visa-2026-10")
    assert sorted(notes(a1.context("debt:visa"))) == [("everyone", "tenant note", "tenant"),
                                                      ("mine", "agent note", "agent"), ("ours", "task note", "task")]
    assert sorted(notes(a2.context("debt:visa"))) == [("everyone", "tenant note", "tenant"), ("ours", "task note", "task")]
    assert notes(t2.context("debt:visa")) == [("everyone", "tenant note", "tenant")]
    logged = [json.loads(x) for x in events.read_text().splitlines()][-3:]
    assert [e["type"] for e in logged] == ["keel.annotated"] * 3 and logged[0]["by"] == "agent:a1"


def test_notes_expire_by_ttl_but_stay_in_history(env) -> None:
    make, clock, _ = env
    t = make()
    fact = t.annotate("debt:visa", "reminder", "call bank", "agent")["fact"]
    assert fact["expires_at"] == "2026-12-01T12:00:00Z" and fact["valid_to"] == fact["expires_at"]
    clock.now = T0 + 2 * DAY
    assert notes(t.context("debt:visa")) == []
    assert [v["value"] for v in t.history("debt:visa", "reminder")["versions"]] == ["call bank"]


def test_tenant_notes_never_expire_and_need_real_evidence(env) -> None:
    make, _, _ = env
    t = make()
    with pytest.raises(NoteRefused, match="evidence"):
        t.annotate("debt:visa", "p", 1, "tenant")
    with pytest.raises(NoteRefused, match="not an event of this tenant"):
        t.annotate("debt:visa", "p", 1, "tenant", evidence="made-up")
    with pytest.raises(PermissionError):
        t.annotate("debt:visa", "p", 1, "tenant", evidence="made-up")
    other = make(tenant="other-home")
    with pytest.raises(UnknownTenant):   # a tenant without events writes nothing
        other.annotate("debt:visa", "p", 1, "tenant", evidence="snap-visa-2026-10")
    fact = t.annotate("debt:visa", "p", 1, "tenant", evidence="snap-visa-2026-10")["fact"]
    assert fact["expires_at"] is None and fact["evidence"] == "snap-visa-2026-10"


def test_refused_notes_write_nothing(env) -> None:
    make, _, events = env
    before = events.read_text()
    with pytest.raises(NoteRefused):
        make().annotate("debt:nope", "p", 1, "agent")
    with pytest.raises(NoteRefused):
        make(agent=None).annotate("debt:visa", "p", 1, "agent")
    assert events.read_text() == before


def test_global_notes_need_the_operator_and_show_on_every_entity_of_the_type(env) -> None:
    make, _, _ = env
    with pytest.raises(NoteRefused, match="disabled"):
        make(allow=False).annotate("type:debt", "tip", "x", "global", evidence="snap-visa-2026-10")
    with pytest.raises(NoteRefused, match="type:<entity type>"):
        make().annotate("debt:visa", "tip", "x", "global", evidence="snap-visa-2026-10")
    make().annotate("type:debt", "tip", "check the rate first", "global", evidence="snap-visa-2026-10")
    make().annotate("rule:debt_expensive", "why", "usury cap is ~ 25%", "global", evidence="snap-visa-2026-10")
    for entity in ("debt:visa", "debt:libranza"):
        assert sorted(notes(make("zz", None).context(entity))) == [
            ("tip", "check the rate first", "global"), ("why", "usury cap is ~ 25%", "global")]
    assert notes(make().context("due:visa-2026-11")) == []
    # issue 21: shown among an entity's facts, a global note says what it is attached to
    shown = {f["predicate"]: f for f in make("zz", None).context("debt:visa")["facts"] if f["scope"] == "global"}
    assert (shown["tip"]["attached_to"], shown["why"]["attached_to"]) == ("type:debt", "rule:debt_expensive")
    assert all("attached_to" not in f for f in make().context("debt:visa")["facts"] if f["scope"] != "global")
    from keel import render
    text = render.context(make("zz", None).context("debt:visa"))
    assert "scope global, on rule:debt_expensive" in text and "scope global, on type:debt" in text


def test_annotated_events_survive_a_rebuild(env) -> None:
    make, _, events = env
    make().annotate("debt:visa", "kept", "yes", "tenant", evidence="snap-visa-2026-10")
    cartridge = load_cartridge(FINANCE)
    rebuilt, report = build_embedded(cartridge, events)
    assert not report.rejected
    t = Tools(cartridge, rebuilt.store, "hogar-demo", clock=lambda: T0 + 1)
    assert ("kept", "yes", "tenant") in notes(t.context("debt:visa"))


def test_related_returns_the_list_either_direction(env) -> None:
    make, _, _ = env
    t = make()
    assert [r["relation"] for r in t.related("debt:visa")["relations"]] == ["for_debt"] * 3 + ["owed_by"]
    assert [r["subject"] for r in t.related("household:hogar-demo")["relations"]] == ["debt:libranza", "debt:visa"]
    assert t.related("debt:visa", "owed_by", at="2026-08-01")["relations"] == []


def test_the_task_of_a_note_is_the_callers_binding_never_an_argument(env) -> None:
    make, _, _ = env
    with pytest.raises(TypeError):
        make("a1", "t1").annotate("debt:visa", "p", 1, "task", task="t2")   # type: ignore[call-arg]
    with pytest.raises(NoteRefused, match="bound to no task"):
        make("a1", None).annotate("debt:visa", "p", 1, "task")
    fact = make("a1", "t1").annotate("debt:visa", "p", 1, "task")["fact"]
    assert fact["scope"] == "task"
    assert ("p", 1, "task") in notes(make("a2", "t1").context("debt:visa"))
    assert ("p", 1, "task") not in notes(make("a2", "t2").context("debt:visa"))


def test_oversized_note_values_and_trailing_newlines_are_refused(env) -> None:
    make, _, _ = env
    with pytest.raises(UsageError, match="at most"):
        make().annotate("debt:visa", "p", "x" * 5000, "agent")
    with pytest.raises(UsageError):
        make().context("debt:visa\n")
    with pytest.raises(UsageError):
        make(tenant="hogar-demo\n")


def test_a_retried_note_within_the_window_is_written_once(env) -> None:
    """Issue 10: an agent that retries annotate (e.g. after a timeout) must not write the note twice; the
    event id is derived from the call and the clock-aligned window (keel.notes.note_id)."""
    make, clock, events = env
    t = make()
    first = t.annotate("debt:visa", "next_step", "call the bank", "agent")
    clock.now += 60_000_000                                  # a minute later: a retry
    again = t.annotate("debt:visa", "next_step", "call the bank", "agent")
    assert first["applied"] and again["applied"] and again["event_id"] == first["event_id"]
    assert again["fact"] == first["fact"]
    assert [v["value"] for v in t.history("debt:visa", "next_step")["versions"]] == ["call the bank"]
    assert events.read_text().count(first["event_id"]) == 1
    other = make(agent="a2").annotate("debt:visa", "next_step", "call the bank", "agent")   # another caller
    assert other["event_id"] != first["event_id"]
    clock.now += 3600_000_000                                # a later window: a new note
    later = t.annotate("debt:visa", "next_step", "call the bank", "agent")
    assert later["event_id"] != first["event_id"]


def test_a_note_in_the_log_but_not_applied_yet_is_a_success_with_applied_false(env, tmp_path: Path) -> None:
    """Issue 10: under lag, annotate reported failure for notes that were applied later."""
    from keel.errors import WriteTimeout
    make, _, _ = env
    t = make()
    sent: list[dict] = []

    class LaggingLog:
        def append(self, envelope: dict) -> None:
            sent.append(envelope)
            raise WriteTimeout(envelope["id"], envelope["tenant"], 10)
    t.log = LaggingLog()
    result = t.annotate("debt:visa", "next_step", "call", "agent")
    assert result["applied"] is False and result["event_id"] == sent[0]["id"] and "fact" not in result
    assert "will be applied" in result["message"] and "not applied within 10s" in result["message"]


def test_a_note_is_measured_in_bytes_before_anything_is_written(env) -> None:
    """Issue 21: the tool counted characters (4,096), the graph bytes (limits.value_bytes): a note of 1,400 CJK
    characters (4,200 bytes) passed the tool, was appended to the events file, then refused by the graph, and
    every later command reported that line. One check, in bytes, before the log: nothing reaches any log."""
    make, _, events = env
    before = events.read_bytes()
    t = make()
    sent: list[dict] = []

    class RecordingLog:
        def append(self, envelope: dict) -> None:
            sent.append(envelope)
    with pytest.raises(UsageError, match=r"at most 4096 bytes .*got 4200"):
        t.annotate("debt:visa", "memo", "東" * 1400, "task")
    t.log = RecordingLog()          # the same check precedes a Kafka log (MCP and CLI call this method)
    with pytest.raises(UsageError, match="bytes"):
        t.annotate("debt:visa", "memo", {"text": "é" * 2100}, "task")
    assert sent == [] and events.read_bytes() == before
    t = make()
    assert t.annotate("debt:visa", "memo", "東" * 1365, "task")["applied"]    # 4,095 bytes: within the limit
    _, report = build_embedded(load_cartridge(FINANCE), events)
    assert not report.rejected


def test_the_file_log_keeps_no_line_the_graph_refuses(env) -> None:
    """Whatever refuses an event after its line was written (here a value over the limit sent past the
    tool), the events file is left as it was."""
    make, _, events = env
    before = events.read_bytes()
    log = make().log
    envelope = {"id": "n-big", "tenant": "hogar-demo", "type": "keel.annotated", "subject": "debt:visa",
                "occurred_at": "2026-11-30T12:00:00Z", "source": "keel.annotate",
                "payload": {"predicate": "memo", "value": "東" * 1400, "scope": "tenant",
                            "evidence": "snap-visa-2026-10"}}
    with pytest.raises(Exception, match="4096-byte limit"):
        log.append(envelope)
    assert events.read_bytes() == before


def test_an_entity_of_an_unknown_type_is_a_usage_error_listing_the_types(env) -> None:
    """Issue 21: `context truck:V-1` said "unknown entity" (exit 1); README lists unknown types under exit 2.
    One rule in every tool: a usage error naming the cartridge's types."""
    make, _, events = env
    t = make()
    before = events.read_bytes()
    calls = [lambda: t.context("truck:V-1"), lambda: t.history("truck:V-1"), lambda: t.related("truck:V-1"),
             lambda: t.annotate("truck:V-1", "memo", "x", "task"), lambda: t.search("visa", type="truck")]
    for call in calls:
        with pytest.raises(UsageError, match="'truck' is not an entity type of the cartridge; use one of "
                                             "account, debt, due, household"):
            call()
    with pytest.raises(UsageError, match="global notes attach to type:"):
        t.annotate("type:debt", "memo", "x", "task")
    assert events.read_bytes() == before
    with pytest.raises(UnknownEntity):          # a declared type without that id stays a negative answer
        t.context("debt:nope")


@pytest.mark.parametrize(("name", "says"), [("bad name", "holds ' '"), ("1st", "starts with '1'"),
                                            ("né", "holds 'é'"), ("x" * 129, "129 characters"),
                                            ("", "required"), (None, "required")])
def test_a_malformed_note_name_says_what_is_wrong_and_what_a_name_may_hold(env, name, says) -> None:
    """Issue 21: a malformed name was refused as `payload.predicate: required` although one was given."""
    make, _, events = env
    before = events.read_bytes()
    with pytest.raises(UsageError, match="predicate") as e:
        make().annotate("debt:visa", name, "x", "task")
    assert says in str(e.value) and "ASCII letters, digits, _ . and -" in str(e.value)
    assert "payload" not in str(e.value) and events.read_bytes() == before


def test_the_tool_accepts_exactly_the_note_names_the_envelope_accepts(env) -> None:
    from keel.errors import EnvelopeRejected
    from keel.notes import NOTE_NAME
    cartridge = load_cartridge(FINANCE)
    projector, _ = build_embedded(cartridge, FINANCE / "events.jsonl")
    for name in ("next_step", "_x", "risk.level", "a-b", "A9", "x" * 128, "x" * 129, "9a", "a b", "é", ".a", "a/b"):
        envelope = {"id": "n1", "tenant": "hogar-demo", "type": "keel.annotated", "subject": "debt:visa",
                    "occurred_at": "2026-11-30", "payload": {"predicate": name, "value": 1, "scope": "tenant"}}
        try:
            projector.parse(envelope)
            accepted = True
        except EnvelopeRejected:
            accepted = False
        assert bool(NOTE_NAME.fullmatch(name)) == accepted, name


def test_history_shows_every_kind_of_timeline_with_evidence_and_supersession(tmp_path: Path) -> None:
    """Issue 21: `history` covered facts only; a label rename and a retracted link showed only through
    context/related at chosen times. Now labels, facts, notes and relations, each version with its evidence
    and what superseded it."""
    events = tmp_path / "events.jsonl"
    extra = [{"id": "snap-visa-2026-11", "tenant": "hogar-demo", "type": "debt.snapshot", "subject": "debt:visa",
              "occurred_at": "2026-11-01", "recorded_at": "2026-11-20T00:00:00Z",
              "payload": {"creditor": "Banco Andino", "product": "Visa Oro", "balance_cop": 3500000,
                          "rate_ea_pct": 29.22, "installment_cop": 380000, "month": "2026-11"}},
             {"id": "retract-pay-visa-2026-10", "tenant": "hogar-demo", "type": "keel.retracted",
              "subject": "due:visa-2026-10", "occurred_at": "2026-11-21", "recorded_at": "2026-11-21T00:00:00Z",
              "by": "human:ana", "payload": {"event": "pay-visa-2026-10", "reason": "bounced"}}]
    events.write_text((FINANCE / "events.jsonl").read_text() + "".join(json.dumps(e) + "\n" for e in extra))
    cartridge = load_cartridge(FINANCE)
    projector, report = build_embedded(cartridge, events)
    assert not report.rejected
    t = Tools(cartridge, projector.store, "hogar-demo", agent="a1", task="t1", log=FileLog(projector, events),
              clock=lambda: T0)
    t.annotate("debt:visa", "next_step", "call", "task")
    h = t.history("debt:visa")
    assert list(h) == ["entity", "versions", "labels", "relations", "known_through"]
    products = [(v["value"], v["valid_from"][:10], v["evidence"]) for v in h["labels"] if v["label"] == "product"]
    assert products[-2:] == [("Visa", "2026-10-01", "snap-visa-2026-10"), ("Visa Oro", "2026-11-01", "snap-visa-2026-11")]
    assert list(h["labels"][0]) == ["label", "value", "valid_from", "valid_to", "recorded_at", "source", "evidence",
                                    "by", "corrected_by", "superseded_at", "superseded_by"]
    assert {(r["subject"], r["relation"]) for r in h["relations"]} >= {("debt:visa", "owed_by"),
                                                                       ("due:visa-2026-09", "for_debt")}
    assert [v["value"] for v in h["versions"] if v["scope"] == "task"] == ["call"]         # notes too
    [paid] = [r for r in t.history("due:visa-2026-10")["relations"] if r["relation"] == "paid_from"]
    assert (paid["object"], paid["evidence"], paid["superseded_at"], paid["superseded_by"]) == (
        "account:ahorros", "pay-visa-2026-10", "2026-11-21T00:00:00Z", "retract-pay-visa-2026-10")
    [then] = [r for r in t.history("due:visa-2026-10", known_at="2026-11-01")["relations"]
              if r["relation"] == "paid_from"]
    assert then["superseded_by"] is None                                  # believed then
    assert t.related("due:visa-2026-10", "paid_from")["relations"] == []  # and withdrawn now
    only = t.history("debt:visa", predicate="product")                   # a label's name narrows too
    assert only["versions"] == [] and only["relations"] == [] and {v["label"] for v in only["labels"]} == {"product"}
    assert [r["relation"] for r in t.history("debt:visa", predicate="owed_by")["relations"]] == ["owed_by"] * 3
    with pytest.raises(UsageError, match="not a fact, label or relation of debt:visa; use one of .*creditor"):
        t.history("debt:visa", predicate="colour")
    from keel import render
    text = render.history(h)
    assert ["labels:", "facts:", "notes:", "relations:"] == [x for x in text.splitlines() if x.endswith(":")
                                                             and not x.startswith(" ")][1:]
    assert "product=Visa Oro valid 2026-11-01 -> open" in text
    assert "superseded 2026-11-21 by retract-pay-visa-2026-10" in render.history(t.history("due:visa-2026-10"))


def test_known_through_of_a_known_at_question_is_what_the_answer_is_based_on(env) -> None:
    """Issue 21: with known_at K, known_through gave the latest event applied (after K), not what was known at
    K. It is K when later events were applied (the answer is the state after exactly the events recorded by
    K), and applied_through keeps the latest applied."""
    make, _, _ = env
    t = make()
    latest = t.context("debt:visa")["known_through"]
    assert latest == "2026-11-10T00:00:00Z" and "applied_through" not in t.context("debt:visa")
    for result in (t.context("debt:visa", known_at="2026-10-02"), t.history("debt:visa", known_at="2026-10-02"),
                   t.related("debt:visa", known_at="2026-10-02"), t.search("visa", known_at="2026-10-02")):
        assert (result["known_through"], result["applied_through"]) == ("2026-10-02T00:00:00Z", latest)
    later = t.context("debt:visa", known_at="2027-01-01")          # nothing was recorded after the latest
    assert later["known_through"] == later["applied_through"] == latest
    from keel import render
    assert render.fresh(t.context("debt:visa", known_at="2026-10-02")) == \
        "(known through 2026-10-02T00:00:00Z; applied through 2026-11-10T00:00:00Z)"


def test_corrected_by_follows_the_one_documented_rule(tmp_path: Path) -> None:
    """Issue 21: a `corrects` that also moved occurred_at showed `by` but not `corrected_by`, and the docs
    disagreed on when it appears. The rule (docs/semantics.md): corrected_by marks a version that won its own
    valid_from over an earlier assertion; history's superseded_by names the correction either way."""
    events = tmp_path / "events.jsonl"
    moved = {"id": "pay-visa-2026-10-fix", "tenant": "hogar-demo", "type": "due.paid", "subject": "due:visa-2026-10",
             "occurred_at": "2026-10-04", "recorded_at": "2026-11-11T00:00:00Z", "by": "human:ana",
             "corrects": "pay-visa-2026-10", "payload": {"paid_on": "2026-10-04", "amount_cop": 380000,
                                                         "account_id": "ahorros", "movement_id": "mov-1003-7"}}
    kept = {"id": "pay-libranza-2026-10-fix", "tenant": "hogar-demo", "type": "due.paid",
            "subject": "due:libranza-2026-10", "occurred_at": "2026-10-10", "recorded_at": "2026-11-11T00:00:00Z",
            "by": "human:ana", "corrects": "pay-libranza-2026-10",
            "payload": {"paid_on": "2026-10-10", "amount_cop": 510000, "account_id": "nomina", "movement_id": "m"}}
    events.write_text((FINANCE / "events.jsonl").read_text() + json.dumps(moved) + "\n" + json.dumps(kept) + "\n")
    cartridge = load_cartridge(FINANCE)
    projector, report = build_embedded(cartridge, events)
    assert not report.rejected
    t = Tools(cartridge, projector.store, "hogar-demo")
    [fixed] = [f for f in t.context("due:libranza-2026-10")["facts"] if f["predicate"] == "amount_paid_cop"]
    assert (fixed["value"], fixed["corrected_by"]) == (510000, "human:ana")      # same point: corrected_by
    [old, new] = [v for v in t.history("due:visa-2026-10", "status")["versions"] if v["value"] == "paid"]
    assert (new["valid_from"], new["by"], new["corrected_by"]) == ("2026-10-04T00:00:00Z", "human:ana", None)
    assert (old["superseded_by"], old["superseded_at"]) == ("pay-visa-2026-10-fix", "2026-11-11T00:00:00Z")
    same_point = [v for v in t.history("debt:libranza", "balance_cop")["versions"]
                  if v["evidence"] == "snap-libranza-2026-10-fix"]      # the sample's same-point snapshot
    assert [(v["by"], v["corrected_by"]) for v in same_point] == [("human:ana", "human:ana")]


@pytest.mark.services
def test_history_of_every_timeline_is_the_same_on_redis(redis_url: str, tmp_path: Path) -> None:
    """history's labels and relations come from Store.keys and recorded_versions_many: every backend answers
    them alike, retracted and corrected versions included."""
    import uuid

    from keel import Projector
    from keel.embedded import replay_file
    from keel.store.redis import RedisStore
    events = tmp_path / "events.jsonl"
    retract = {"id": "retract-pay-visa-2026-10", "tenant": "hogar-demo", "type": "keel.retracted",
               "subject": "due:visa-2026-10", "occurred_at": "2026-11-21", "recorded_at": "2026-11-21T00:00:00Z",
               "payload": {"event": "pay-visa-2026-10"}}
    events.write_text((FINANCE / "events.jsonl").read_text() + json.dumps(retract) + "\n")
    cartridge = load_cartridge(FINANCE)
    embedded, _ = build_embedded(cartridge, events)
    store = RedisStore.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:12]}")
    try:
        assert not replay_file(Projector(cartridge, store), events).rejected
        mine, theirs = (Tools(cartridge, s, "hogar-demo", clock=lambda: T0) for s in (embedded.store, store))
        for entity in ("debt:visa", "debt:libranza", "due:visa-2026-10", "household:hogar-demo", "account:ahorros"):
            for known_at in (None, "2026-10-02", "2026-11-20"):
                answers = []
                for t in (mine, theirs):
                    try:
                        answers.append(t.history(entity, known_at=known_at))
                    except UnknownEntity as e:                   # not known yet at known_at: on both
                        answers.append(str(e))
                assert answers[0] == answers[1], (entity, known_at)
    finally:
        store.drop_namespace()
        store.close()
