"""What a running worker is doing, on request: `kill -USR1 <pid>` logs each asyncio task's stack and each cartridge's
consumer state (assignment epoch, partitions waiting for their resume point, paused partitions, positions).

An operator aid for a worker that makes no progress and logs nothing: it tells a loop parked in an await from
one that spins. mode's own SIGUSR1 handler printed every thread's local variables (a planning thread's locals
hold event payloads: personal data) and its SIGUSR2 started pdb on a process without a terminal (a hang); the
worker replaces both with this dump (workers/app.py). Stacks name files, lines and functions only; the state
names partitions and offsets only.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("keel.worker.diagnose")


def task_stacks() -> list[str]:
    """One line per asyncio task of the running loop: its name, then the chain of awaits it is parked in."""
    lines = []
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        lines.append(f"task {task.get_name()}: {' -> '.join(_awaits(task.get_coro())) or 'not started'}")
    return lines


def _awaits(coro: Any) -> list[str]:
    """Where a coroutine waits: its frame, then the frame of what it awaits, and so on (cr_await/gi_yieldfrom)."""
    out = []
    while coro is not None and len(out) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            out.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno})")
        elif out or not hasattr(coro, "__await__"):
            out.append(type(coro).__name__)     # a Future, a Task: the end of the chain
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return out


def consumer_state(consumer: Any) -> str:
    """Assignment, paused partitions and each partition's position state, as aiokafka holds them."""
    if consumer is None:
        return "no consumer"
    assigned = sorted(tp.partition for tp in consumer.assignment())
    paused = sorted(tp.partition for tp in consumer.paused())
    states = []
    subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
    assignment = getattr(subscription, "assignment", None)
    for tp in sorted(consumer.assignment(), key=lambda t: t.partition):
        state = assignment.state_value(tp) if assignment is not None else None
        states.append(f"{tp.partition}: {state!r}")
    return f"assigned {assigned}, paused {paused}; positions {'; '.join(states) or 'none'}"


def dump(services: Iterable[Any]) -> None:
    """Log the tasks' stacks, then each service's own state (`diagnosis()`, where it has one)."""
    lines = task_stacks()
    for service in services:
        diagnosis = getattr(service, "diagnosis", None)
        if diagnosis is not None:
            lines.append(diagnosis())
    log.warning("diagnosis on SIGUSR1 (%d task(s)):\n  %s", len(asyncio.all_tasks()), "\n  ".join(lines))
