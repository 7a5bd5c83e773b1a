"""Polling with a deadline, for code and tests that wait on a real cluster to converge."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.25,
    explain: Callable[[], object] | None = None,
) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` otherwise,
    with what ``explain`` says of the state it was stuck in (a failure seen only in CI
    must say more than that a probe stayed false)."""
    deadline = time.monotonic() + timeout
    last: T = probe()
    while not last:
        if time.monotonic() > deadline:
            said = f"; {explain()}" if explain is not None else ""
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what} (last seen: {last!r}){said}"
            )
        time.sleep(interval)
        last = probe()
    return last


def gone(read: Callable[[], object]) -> bool:
    """Whether ``read`` (a Kubernetes client read of one object) answers 404."""
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def wait_gone(read: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Wait until the object ``read`` reads is deleted (404)."""
    wait_until(lambda: gone(read), f"{what} to be deleted", timeout)
