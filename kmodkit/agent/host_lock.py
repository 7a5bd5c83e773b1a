"""One agent at a time per driver on a node.

During a rollout the old loader pod may still be running while the new one
starts loading; a ``kubectl debug`` session may run the agent by hand. An
advisory lock on a host file (``/run/kmodkit/<module>.lock``; /run is cleared
at boot, like the kernel state it guards) serialises them. Serving loaders
also share ``<module>.serving`` for as long as they run, and an unload takes
it alone: nothing unloads a driver that a loader still keeps loaded (and would
load again).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kmodkit.agent.errors import AgentError
from kmodkit.agent.hostroot import HostRoot

LOCK_DIR = "/run/kmodkit"


class LockTimeout(AgentError):
    event = "lock.timeout"


@contextmanager
def host_lock(
    host: HostRoot,
    name: str,
    timeout: float,
    poll: float = 0.1,
    *,
    suffix: str = "lock",
    shared: bool = False,
) -> Iterator[None]:
    directory = host.path(LOCK_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    lock = f"{LOCK_DIR}/{name}.{suffix}"
    fd = os.open(directory / f"{name}.{suffix}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"another kmodkit-agent still holds {lock} after {timeout:g}s; "
                        "is another loader pod of this module running on this node?",
                        lock=lock,
                    ) from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)
