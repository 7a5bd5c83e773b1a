"""One agent at a time per driver on a node.

During a DaemonSet rollout the old loader pod may still be unloading while the
new one starts loading; a ``kubectl debug`` session may run the agent by hand.
An advisory lock on a host file (``/run/kmodkit/<module>.lock``; /run is
cleared at boot, like the kernel state it guards) serialises them.
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
def host_lock(host: HostRoot, name: str, timeout: float, poll: float = 0.1) -> Iterator[None]:
    directory = host.path(LOCK_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"another kmodkit-agent still holds {LOCK_DIR}/{name}.lock "
                        f"after {timeout:g}s; is a second loader pod running on this node?",
                        lock=f"{LOCK_DIR}/{name}.lock",
                    ) from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)
