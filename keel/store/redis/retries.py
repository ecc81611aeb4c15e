"""The generation retry, written once: do again what a switch of a tenant's generation interrupted.

A read or write of the current generation computes its key names from a guess of the tenant's generation; its
script or MULTI/EXEC block checks the guess and does nothing when a replay switched the tenant meanwhile. The
caller corrects the guess and runs the attempt again over what is left, at most RETRIES times in one call,
then gives up with StoreUnavailable naming the tenant.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...errors import StoreUnavailable

RETRIES = 8                       # generation switches (or write conflicts) tolerated during one call
KEPT_CHANGING = "the generation of tenant {tenant!r} kept changing"
KEPT_CONFLICTING = "could not apply a batch of tenant {tenant!r}: it kept conflicting with other writers"

T = TypeVar("T")
R = TypeVar("R")


def until_done(todo: list[T], attempt: Callable[[list[T]], list[T]], tenant_of: Callable[[T], str], *,
               failure: str = KEPT_CHANGING) -> None:
    """Run `attempt` over what is left of `todo` until nothing is: an attempt does what it can with the current
    generation guesses and returns the items to do again (their guesses corrected). After RETRIES attempts,
    StoreUnavailable (`failure`, a format of `tenant`) naming the tenant of the first item left."""
    for _ in range(RETRIES):
        todo = attempt(todo)
        if not todo:
            return
    tenant = tenant_of(todo[0])
    raise StoreUnavailable(failure.format(tenant=tenant), tenant=tenant)


def in_current(tenant: str, attempt: Callable[[], R | None]) -> R:
    """`until_done` for one read of one tenant: `attempt` returns the answer, or None when the tenant's
    generation switched (its guess corrected)."""
    answer: list[R] = []

    def once(left: list[str]) -> list[str]:
        result = attempt()
        if result is None:
            return left
        answer.append(result)
        return []
    until_done([tenant], once, str)
    return answer[0]
