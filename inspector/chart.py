"""The bitemporal picture of one timeline, as numbers a template draws: valid time across (x), recorded time up
(y), one rectangle per version `history` lists.

A version's rectangle spans its validity as `history` reports it (valid_from → valid_to, or to the right edge
while open) and the recorded time it was believed (recorded_at → superseded_at, or to the top while it is still
believed). The latest time on the recorded axis is `known_at` when the view sets one (history is asked as
known then, so nothing recorded later is drawn; its line is drawn there), and the versions believed then run
one step past it, to the top. The axes are spaced by change, not by duration (Axis). Every chart of an entity shares one scale, so the pictures line up. Pure geometry: no I/O,
no tool call.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from keel.times import Micros, format_day

WIDTH = 580                  # the SVG's width in px; the page scales it down on narrow screens
LEFT, RIGHT, TOP, BOTTOM = 112, 14, 20, 24
CHAR_PX = 6.4                # a character of the 11 px label font, wide enough for digits and Latin letters


@dataclass(frozen=True)
class Span:
    """One version as the chart needs it: its times (micros; None is open) and what to show."""
    anchor: str              # the id of its row in the history list (a click on the rectangle goes there)
    label: str               # the value, as shown in the rectangle (shortened to fit)
    title: str               # the whole provenance, shown on hover (<title>)
    valid_from: Micros
    valid_to: Micros | None
    recorded_at: Micros
    superseded_at: Micros | None
    current: bool = False    # the version the view's at / known_at shows
    note: bool = False       # a note (agent memory), drawn in another colour


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float
    span: Span
    text: str                # the label cut to the width ('' when none fits)
    open_right: bool
    open_top: bool

    @property
    def classes(self) -> str:
        kinds = ["version", "superseded" if self.span.superseded_at is not None else "believed"]
        if self.span.current:
            kinds.append("current")
        if self.span.note:
            kinds.append("note")
        return " ".join(kinds)


@dataclass(frozen=True)
class Tick:
    at: float                # px along its axis
    text: str


@dataclass
class Chart:
    key: str                 # the timeline's name: a predicate, `<label> (label)`, `<relation> → <entity>`
    height: int
    boxes: list[Box]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    plot: tuple[float, float, float, float]          # left, top, right, bottom of the plotting area
    at_x: float | None = None                        # the view's `at`, when inside the picture
    known_y: float | None = None                     # the view's `known_at` (the latest recorded time drawn)
    known_text: str = ""
    width: int = WIDTH


@dataclass(frozen=True)
class Axis:
    """Times placed by change, not by duration: every time at which a version starts or ends (and the view's
    at or known_at) is a tick, the ticks equally spaced, so a correction recorded a day after the value it
    replaces is as visible as a year's gap. `open_slot`: one more step past the last time, where versions
    that have not ended run out."""
    points: tuple[Micros, ...]
    open_slot: bool

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("no version to draw")

    @property
    def steps(self) -> int:
        return max(len(self.points) - 1 + (1 if self.open_slot else 0), 1)

    def fraction(self, t: Micros | None) -> float:
        """Where `t` lies from 0 (the first time) to 1 (the far edge); None, or past the last time, is the edge."""
        points = self.points
        if t is None or t > points[-1]:
            return 1.0
        i = bisect_left(points, t)
        if i < len(points) and points[i] == t:
            return i / self.steps
        if i == 0:
            return 0.0
        low, high = points[i - 1], points[i]
        return (i - 1 + (t - low) / (high - low)) / self.steps


@dataclass(frozen=True)
class Scale:
    """The two axes every chart of an entity shares (x: valid time, y: recorded time), so the pictures line up."""
    x: Axis
    y: Axis

    @classmethod
    def of(cls, spans: Iterable[Span], at: Micros | None, known_at: Micros | None) -> Scale:
        spans = list(spans)
        xs = {s.valid_from for s in spans} | {s.valid_to for s in spans if s.valid_to is not None}
        ys = {s.recorded_at for s in spans} | {s.superseded_at for s in spans if s.superseded_at is not None}
        if at is not None:
            xs.add(at)
        if known_at is not None:                     # history as known then: nothing later is drawn
            ys = {y for y in ys if y <= known_at} | {known_at}
        return cls(Axis(tuple(sorted(xs)), True), Axis(tuple(sorted(ys)), True))


def chart(key: str, spans: Sequence[Span], scale: Scale, *, at: Micros | None, known_at: Micros | None,
          height: int = 150) -> Chart:
    """One timeline's picture: a box per span on the shared scale, the axes' ticks and the view's at/known_at."""
    left, top, right, bottom = LEFT, TOP, WIDTH - RIGHT, height - BOTTOM

    def x_of(t: Micros | None) -> float:
        return left + scale.x.fraction(t) * (right - left)

    def y_of(t: Micros | None) -> float:             # recorded time goes up
        return bottom - scale.y.fraction(t) * (bottom - top)

    boxes = []
    for s in spans:
        x_a, x_b = x_of(s.valid_from), x_of(s.valid_to)
        y_low, y_high = y_of(s.recorded_at), y_of(s.superseded_at)
        w, h = max(x_b - x_a, 2.0), max(y_low - y_high, 2.0)
        boxes.append(Box(round(x_a, 1), round(y_high, 1), round(w, 1), round(h, 1), s, fit(s.label, w, h),
                         s.valid_to is None, s.superseded_at is None))
    result = Chart(key, height, boxes, _ticks(scale.x, x_of, 96), _ticks(scale.y, y_of, 13),
                   (left, top, right, bottom))
    if at is not None:
        result.at_x = round(x_of(at), 1)
    if known_at is not None:
        result.known_y, result.known_text = round(y_of(known_at), 1), f"known at {format_day(known_at)}"
    return result


def _ticks(axis: Axis, place: Callable[[Micros], float], room: float) -> list[Tick]:
    """A tick per time of the axis, labelled while `room` px separate the labels (the others stay unlabelled)."""
    ticks, last = [], None
    for t in axis.points:
        at = round(place(t), 1)
        show = last is None or abs(at - last) >= room
        ticks.append(Tick(at, short_time(t) if show else ""))
        if show:
            last = at
    return ticks


def short_time(t: Micros) -> str:
    """`2026-10-01` at midnight UTC, else `2026-10-04 09:00Z` (seconds and fractions when there are some)."""
    text = format_day(t)
    if len(text) == 10:
        return text
    text = text.replace("T", " ")
    return text[:16] + "Z" if text[16:] == ":00Z" else text


def fit(text: str, width: float, height: float) -> str:
    """The label shortened to the box (… when cut), '' when not two characters fit or the box is too low."""
    if height < 13:
        return ""
    room = int((width - 6) / CHAR_PX)
    if room >= len(text):
        return text
    return "" if room < 2 else text[:room - 1] + "…"
