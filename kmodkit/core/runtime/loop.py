"""The reconcile loop every kmodkit daemon runs: a pass, then sleep until woken."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable

import kopf

from kmodkit.core.runtime.watch_cache import Wakeups

log = logging.getLogger("kmodkit.loop")
RETRY_AFTER_ERROR = 10.0
# Watch events come in bursts; one pass serves the burst: it starts this long after the
# burst's first event. Events that came during the pass before have waited that long
# already, and the next pass starts at once (a rollout wave's pods turning ready, say).
DEBOUNCE = 0.3


async def reconcile_loop(
    key: Hashable,
    one_pass: Callable[[], float | None],
    stopped: kopf.DaemonStopped,
    wakeups: Wakeups,
    resync_seconds: float,
) -> None:
    """Run ``one_pass`` (blocking I/O, so in a thread) whenever ``key`` is woken.

    A pass returns seconds until a timed retry is due (or None); without any
    event the loop still resyncs every ``resync_seconds`` as a safety net.
    """
    wake = wakeups.event(key)
    try:
        while not stopped:
            wake.clear()
            try:
                requeue = await asyncio.to_thread(one_pass)
            except Exception:
                log.exception("reconcile of %s failed; retrying in %.0fs", key, RETRY_AFTER_ERROR)
                requeue = RETRY_AFTER_ERROR
            timeout = min(requeue or resync_seconds, resync_seconds)
            waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
            _done, pending = await asyncio.wait(
                waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for w in pending:
                w.cancel()
            # A timed retry (nothing woke the loop) waits the whole of it, as a burst would.
            await asyncio.sleep(max(0.0, DEBOUNCE - wakeups.waited(key)))
    finally:
        wakeups.drop(key)
