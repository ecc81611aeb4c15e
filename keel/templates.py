"""The placeholder grammar of a cartridge's templated values, in one place: a `project:` step's values and a
`sources:` mapping's fields read `{name}` and `{name:date}` (the UTC calendar day of a time), `{{` and `}}` for
literal braces, no conversion and no other format. Each caller checks the names against what it can read."""
from __future__ import annotations

from string import Formatter
from typing import NamedTuple

DAY = "date"        # the one placeholder format: `{occurred_at:date}` is the UTC calendar day YYYY-MM-DD


class Placeholder(NamedTuple):
    name: str
    day: bool       # `{name:date}`


def template_pieces(raw: str) -> tuple[list[str | Placeholder] | None, list[str]]:
    """The literal texts and placeholders of `raw` in order (None when it does not parse), and the problems of
    its grammar, each a sentence naming the text."""
    try:
        parsed = list(Formatter().parse(raw))
    except ValueError as e:
        return None, [f"bad template {raw!r}: {e}"]
    pieces: list[str | Placeholder] = []
    problems: list[str] = []
    for literal, name, spec, conversion in parsed:
        if literal:
            pieces.append(literal)
        if name is None:
            continue
        if conversion or spec not in ("", DAY):
            problems.append(f"{raw!r}: a placeholder takes no conversion, and no format but :{DAY} (the UTC "
                            "calendar day of a time)")
        pieces.append(Placeholder(name, spec == DAY))
    return pieces, problems
