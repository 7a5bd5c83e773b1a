"""Polling with a deadline, for code and tests that wait on a real cluster to converge."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.25
) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: T = probe()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what} (last seen: {last!r})"
            )
        time.sleep(interval)
        last = probe()
    return last
