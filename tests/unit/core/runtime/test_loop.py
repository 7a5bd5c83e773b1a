"""The reconcile loop's debounce: a pass starts DEBOUNCE after the first event it serves.

Events that came during a pass have waited through it, so the next pass starts at once; an
event that comes to an idle loop waits for the rest of its burst. The passes are functions
that record when they ran.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kmodkit.core.runtime import loop
from kmodkit.core.runtime.watch_cache import Wakeups
from tests.unit.core.runtime.daemon_stopped import Stopped

KEY = ("modules", "ns", "m")
DEBOUNCE = 0.5


async def _two_passes(wake_during_first_pass: bool) -> float:
    """Seconds between the end of the first pass and the start of the second."""
    wakeups, stopped = Wakeups(), Stopped()
    ended: list[float] = []
    started: list[float] = []

    def one_pass() -> None:
        started.append(time.monotonic())
        if len(started) == 2:
            stopped.set()
        elif wake_during_first_pass:
            wakeups.wake(KEY)  # the watch hears of a change while a long pass runs
            time.sleep(DEBOUNCE + 0.1)
        ended.append(time.monotonic())

    task = asyncio.create_task(loop.reconcile_loop(KEY, one_pass, stopped, wakeups, 60))  # type: ignore[arg-type]
    if not wake_during_first_pass:
        while not ended:
            await asyncio.sleep(0.01)
        wakeups.wake(KEY)  # the change comes to an idle loop
    await asyncio.wait_for(task, 10)
    return started[1] - ended[0]


def test_an_event_during_a_pass_starts_the_next_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "DEBOUNCE", DEBOUNCE)
    assert asyncio.run(_two_passes(wake_during_first_pass=True)) < DEBOUNCE / 2


def test_an_event_to_an_idle_loop_waits_for_its_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "DEBOUNCE", DEBOUNCE)
    assert asyncio.run(_two_passes(wake_during_first_pass=False)) >= DEBOUNCE


def test_waited_counts_from_the_first_wake_since_the_event_was_cleared() -> None:
    now = [0.0]
    wakeups = Wakeups(clock=lambda: now[0])
    event = wakeups.event(KEY)
    assert wakeups.waited(KEY) == 0.0
    wakeups.wake(KEY)
    now[0] = 2.0
    wakeups.wake(KEY)
    now[0] = 3.0
    assert wakeups.waited(KEY) == 3.0
    event.clear()
    assert wakeups.waited(KEY) == 0.0
    wakeups.wake_all()
    now[0] = 3.5
    assert wakeups.waited(KEY) == 0.5
