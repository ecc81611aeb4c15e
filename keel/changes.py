"""What changed since: a tenant's change log read as change rows (docs/semantics.md, "What changed since").

Every store keeps, per tenant, the assertions it applied in apply order (`StoreReads.changes`): one entry per
write, numbered from 0. Because a tenant's recorded_at never goes backwards in its log (keel.envelope clamps
it), that order is also recorded order. A page is a run of that log read in one atomic step with the tenant's
known_through; its cursor names the generation and the next position, so paging never misses nor repeats an
entry while ingest goes on. This module turns entries into the rows `history` answers with, and reads and
writes cursors; it knows nothing of any backend.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from .envelope import ERASED
from .errors import UsageError
from .notes import withdrawal_of
from .store.roles import ChangeEntry, StoreReads, Window
from .store.shapes import scope_of
from .store.writes import Key
from .timeline import Assertion, holding, is_retraction_void, is_void, next_point, valid_until
from .times import Micros, format_time

DEFAULT_CHANGES = 100          # changes per answer when `limit` is not given
MAX_CHANGES = 500              # the most one answer holds
SCAN_FACTOR = 4                # a page reads at most limit * SCAN_FACTOR entries (some may be filtered out)
WINDOW = 4                     # assertions read of the point before a change's (StoreReads.windows_many)

_WHAT = {"l": "label", "r": "relation", "e": "entity"}
_CURSOR = re.compile(r"c([1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,14})\.(-?[0-9]{1,17})")


class ChangesPage(NamedTuple):
    """One answer's worth: the rows, where the next answer starts, whether the log held more, and the recorded
    time through which the answer is complete."""
    rows: list[dict[str, Any]]
    cursor: str
    more: bool
    through: Micros | None


class Cursor(NamedTuple):
    """Where the next page starts: the generation of the log read, the position of its next entry, and the
    recorded_at of the last entry returned (where a cursor of a replaced generation resumes)."""
    generation: int
    position: int
    recorded_at: Micros

    def text(self) -> str:
        return f"c{int(self.generation)}.{int(self.position)}.{int.__repr__(int(self.recorded_at))}"


def parse_cursor(value: object) -> Cursor | None:
    """A `cursor` argument as given back by a previous answer (None when absent), else a usage error."""
    if value is None or value == "":
        return None
    m = _CURSOR.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise UsageError("cursor: pass back the `cursor` of a previous changes answer unchanged")
    return Cursor(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def read_changes(store: StoreReads, tenant: str, *, since: Micros | None, after: Cursor | None, limit: int,
                 type: str | None, scopes: set[str]) -> ChangesPage:
    """Up to `limit` changes the caller sees (of entities of `type`) after `after` (else recorded after `since`):
    reads of the log (limit + 1 entries, then more while some were filtered out, at most limit * SCAN_FACTOR in
    all) and one read of the timelines they touch. A cursor of a replaced generation resumes from its recorded
    time (changes of that very microsecond may come again)."""
    def wanted(key: Key) -> bool:
        return visible(key, scopes) and of_type(key, type)

    def first(n: int) -> Callable[[Key], bool]:
        """`wanted`, for the first n entries it accepts (change_page asks in log order: windows of those only)."""
        left = [n]

        def keep(key: Key) -> bool:
            if left[0] > 0 and wanted(key):
                left[0] -= 1
                return True
            return False
        return keep

    page = store.change_page(tenant, start=None if after is None else after.position,
                             since=since if after is None else after.recorded_at - 1,
                             generation=None if after is None else after.generation, count=limit + 1,
                             window=WINDOW, keep=first(limit))
    read, kept, used = list(page.entries), [], 0
    windows = dict(page.windows) if page.windows is not None else None
    budget = limit * SCAN_FACTOR
    while True:
        while used < len(read) and used < budget and len(kept) < limit:
            entry = read[used]
            used += 1
            if wanted(entry.key):
                kept.append(entry)
        end = page.start + len(page.entries)
        if len(kept) == limit or used == budget or used < len(read) or end >= page.length:
            break
        nxt = store.change_page(tenant, start=end, generation=page.generation,
                                count=min(budget - used, 4 * limit) + 1, window=WINDOW,
                                keep=first(limit - len(kept)))
        if nxt.generation != page.generation or nxt.start != end:
            break                       # replaced meanwhile: answer with what was read
        page = nxt
        read += page.entries
        if windows is not None and page.windows is not None:
            windows.update(page.windows)
        else:
            windows = None
    first = read[0].position if read else page.start
    more = first + used < page.length
    rows = change_rows(store, tenant, kept, windows) if kept else []
    for row in rows:            # values the caller may change (an embedded graph keeps its own)
        row["old"], row["new"] = _own(row["old"]), _own(row["new"])
    through = page.known_through
    if used:
        last = read[used - 1].assertion.recorded_at
    else:
        last = after.recorded_at if after is not None else (since or 0)
    if more:            # complete through the last time wholly returned
        following = read[used].assertion.recorded_at if used < len(read) else last
        through = last if following > last else last - 1
    return ChangesPage(rows, Cursor(page.generation, first + used, last).text(), more, through)


def of_type(key: Key, type: str | None) -> bool:
    """Whether a change of `key` concerns an entity of `type` (a relation: either end)."""
    if type is None:
        return True
    prefix = type + ":"
    return key[1].startswith(prefix) or (key[0] == "r" and key[3].startswith(prefix))


def visible(key: Key, scopes: set[str]) -> bool:
    """Whether the caller sees changes of `key`: labels, relations, domain facts, and the notes of its scopes."""
    return key[0] != "f" or key[3] == "" or key[3] in scopes


def change_rows(store: StoreReads, tenant: str, entries: list[ChangeEntry],
                read: dict[int, Window] | None = None) -> list[dict[str, Any]]:
    """The rows of entries: each from a window of its timeline around its point (those `read` with the page by
    StoreReads.change_page, by position, else StoreReads.windows_many's), or from the whole timeline when the
    window does not decide it."""
    missing = [e for e in entries if read is None or e.position not in read]
    got = iter(store.windows_many(tenant, [(e.key, e.assertion.point) for e in missing], WINDOW) if missing else ())
    windows = [read[e.position] if read is not None and e.position in read else next(got) for e in entries]
    rows = [change_row(e.key, e.assertion, w) for e, w in zip(entries, windows)]
    undecided = sorted({e.key for e, row in zip(entries, rows) if row is None})
    if undecided:
        whole = dict(zip(undecided, store.assertions_many(tenant, undecided)))
        rows = [row if row is not None else change_row(e.key, e.assertion, Window(whole[e.key], None, None, True))
                for e, row in zip(entries, rows)]
    return cast(list[dict[str, Any]], rows)


def change_row(key: Key, a: Assertion, window: Window) -> dict[str, Any] | None:
    """One change: which timeline, what happened (`change`), the value at the change's point just before and
    just after the change was recorded (`old`, `new`), the valid times of the version it concerns (`valid_to`
    as known now) and its provenance. None when the window (keel.store.roles.Window) does not decide the row."""
    before, met = _before(window.assertions, a)
    if not met and not window.whole:
        return None             # the window does not hold the change itself: it cannot tell what came before it
    old = holding(before, a.point)
    if is_void(a):              # the point counts for nothing now: what held before it shows through
        restored = holding(before, a.point, below=True)
        new = _value(key, restored)
    else:
        restored = None
        ended = a.closed or (a.expires_at is not None and a.expires_at <= a.point)
        new = None if ended else True if key[0] in "re" else a.value      # a value wins its own point
    if window.low is not None and (old is None or (restored is None and is_void(a))):
        return None             # what held before may lie below the window
    following = next_point(window.assertions, a.point) if window.whole else window.next_point
    change, valid_from, valid_to = _what_happened(a, before, old, following)
    kind = key[0]
    if kind == "f" and key[2] == ERASED and change == "version":
        change = "erased"           # the receipt of a data subject's erasure (keel erase): its keys are gone
    row: dict[str, Any] = {
        "entity": key[1], "what": _WHAT.get(kind) or ("fact" if key[3] == "" else "note"),
        "name": None if kind == "e" else key[2], "object": key[3] if kind == "r" else None,
        "scope": scope_of(key[3]) if kind == "f" else None, "change": change,
        "old": _value(key, old), "new": new,
        "valid_from": format_time(valid_from), "valid_to": format_time(valid_to),
        "recorded_at": format_time(a.recorded_at), "source": a.source, "evidence": a.evidence, "by": a.by}
    if change == "withdrawn":
        withdrawn = withdrawal_of(a) or {}
        row["reason"] = withdrawn.get("reason")
    return row


def _before(timeline: list[Assertion], a: Assertion) -> tuple[list[Assertion], bool]:
    """The assertions of a timeline recorded before `a` in log order: at `a`'s own point those listed before it
    (log order), at other points those recorded strictly earlier; and whether `a` was met."""
    out: list[Assertion] = []
    met = False
    for x in timeline:
        if x.point == a.point:
            if met or x is a or x == a:
                met = True
            else:
                out.append(x)
        elif x.recorded_at < a.recorded_at:
            out.append(x)
    return out, met


def _what_happened(a: Assertion, before: list[Assertion], old: Assertion | None, following: Micros | None
                   ) -> tuple[str, Micros | None, Micros | None]:
    """(change, valid_from, valid_to): a value asserted (`version`, or `corrected` when it replaces an earlier
    assertion at its point) valid from its point to the next point (or its expiry); an end (`closed`,
    `withdrawn` for a note) of the version it ended; a void (`retracted` by keel.retracted, `corrected` by an
    event's correction) from its point to the next."""
    if is_void(a):
        return ("retracted" if is_retraction_void(a) else "corrected"), a.point, following
    if a.closed:
        start = old.point if old is not None else None
        return ("withdrawn" if withdrawal_of(a) is not None else "closed"), start, a.point
    shared = any(x.point == a.point for x in before)
    return ("corrected" if shared else "version"), a.point, valid_until(a, following)


def _own(value: Any) -> Any:
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value


def _value(key: Key, a: Assertion | None) -> Any:
    """The value of the assertion holding as a row shows it: a relation or an entity's existence as true, nothing
    as null."""
    if a is None:
        return None
    return True if key[0] in "re" else a.value
