"""The generation retry of the Redis store (keel/store/redis/retries.py): what is left is tried again, at most
RETRIES times, then StoreUnavailable names the tenant. (Reads and commits that follow a real switch: the
generation suites, tests/test_redis_generations.py and tests/support/redis_checks.py.)"""
from __future__ import annotations

import pytest

from keel.errors import StoreUnavailable
from keel.store.redis.retries import KEPT_CONFLICTING, RETRIES, in_current, until_done


def test_only_what_is_left_is_tried_again() -> None:
    seen: list[list[str]] = []
    answers = iter([["b", "c"], ["c"], []])

    def attempt(todo: list[str]) -> list[str]:
        seen.append(list(todo))
        return next(answers)
    until_done(["a", "b", "c"], attempt, str)
    assert seen == [["a", "b", "c"], ["b", "c"], ["c"]]


def test_nothing_to_do_is_one_attempt() -> None:
    seen: list[list[int]] = []
    until_done([], lambda todo: seen.append(todo) or [], str)
    assert seen == [[]]


def test_it_gives_up_after_retries_naming_the_tenant_left() -> None:
    tries = []

    def attempt(todo: list[tuple[str, int]]) -> list[tuple[str, int]]:
        tries.append(len(todo))
        return todo[1:]                 # one done per attempt, never all of them
    steps = [(f"t{i}", i) for i in range(RETRIES + 2)]
    with pytest.raises(StoreUnavailable) as caught:
        until_done(steps, attempt, lambda s: s[0])
    assert tries == list(range(RETRIES + 2, 2, -1))
    assert caught.value.tenant == f"t{RETRIES}"
    assert str(caught.value) == f"the generation of tenant 't{RETRIES}' kept changing"


def test_a_commit_gives_up_with_its_own_reason() -> None:
    with pytest.raises(StoreUnavailable) as caught:
        until_done(["acme"], lambda todo: todo, str, failure=KEPT_CONFLICTING)
    assert caught.value.tenant == "acme"
    assert str(caught.value) == "could not apply a batch of tenant 'acme': it kept conflicting with other writers"


def test_one_read_returns_the_first_answer_of_a_current_generation() -> None:
    answers = iter([None, None, [0]])
    calls = []

    def attempt() -> list[int] | None:
        calls.append(1)
        return next(answers)
    assert in_current("acme", attempt) == [0]
    assert len(calls) == 3


def test_an_empty_answer_is_an_answer() -> None:
    assert in_current("acme", list) == []


def test_one_read_gives_up_after_retries() -> None:
    calls = []

    def attempt() -> None:
        calls.append(1)
    with pytest.raises(StoreUnavailable) as caught:
        in_current("acme", attempt)
    assert len(calls) == RETRIES and caught.value.tenant == "acme"
