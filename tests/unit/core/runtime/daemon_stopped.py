"""A stand-in for kopf.DaemonStopped, for tests that run a reconcile loop or a daemon."""

from __future__ import annotations

import asyncio


class Stopped:
    """Stands in for kopf.DaemonStopped: falsy until set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
