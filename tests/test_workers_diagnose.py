"""workers/diagnose.py: the SIGUSR1 dump names where each asyncio task waits, down the chain of awaits (a running
worker's dump is checked in tests/test_workers_positioning.py)."""
from __future__ import annotations

import asyncio

from workers.diagnose import consumer_state, task_stacks


async def _parked(event: asyncio.Event) -> None:
    await _inner(event)


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


def test_each_task_is_named_with_the_chain_of_awaits_it_is_parked_in() -> None:
    async def main() -> list[str]:
        event = asyncio.Event()
        task = asyncio.create_task(_parked(event), name="parked-task")
        await asyncio.sleep(0)
        lines = task_stacks()
        event.set()
        await task
        return lines
    line = next(line for line in asyncio.run(main()) if line.startswith("task parked-task:"))
    assert line.index("_parked (test_workers_diagnose.py") < line.index("_inner (test_workers_diagnose.py") \
        < line.index("wait (locks.py")


def test_a_service_without_a_consumer_yet_says_so() -> None:
    assert consumer_state(None) == "no consumer"
