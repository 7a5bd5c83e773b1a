"""The loader pods' copies of module images on the host, and when they may go.

A loader pod's init containers copy the image's modules (and firmware) into
``/var/lib/kmodkit/staging/<namespace>.<module>/<pod UID>/`` on the host
rather than into an ``emptyDir``: ``kubectl drain`` refuses pods with an
``emptyDir`` unless told to delete its data, and a loader pod must never be
what stops a drain. Copies on the host outlive their pods, so every agent
takes care of them:

- an agent holds its own copy's ``claim`` (an advisory lock, touched every
  hour) for as long as it runs, so no other agent removes a copy in use;
- a starting agent removes every copy nobody holds that was not touched for
  a day (a pod's copy is never removed while its container restarts, or
  while its init containers copy);
- an unloader that succeeded removes its module's copies whose agents have
  stopped: nothing of the module is left on the node.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kmodkit.agent.errors import AgentError
from kmodkit.agent.hostroot import HostRoot
from kmodkit.agent.jsonlog import EventLog

STAGING_ROOT = "/var/lib/kmodkit/staging"
# The host path of this pod's copy: .../<namespace>.<module>/<pod UID> (set by the engine).
STAGING_ENV = "KMODKIT_STAGING_DIR"
CLAIM = "claim"
# How long a copy nobody holds is kept (restarts and copying happen well within it).
IDLE_SECONDS = 24 * 3600.0
TOUCH_SECONDS = 3600.0


class StagingError(AgentError):
    event = "staging.failed"


@contextlib.contextmanager
def claimed(host: HostRoot, staging: str | None, log: EventLog) -> Iterator[Path | None]:
    """Hold this pod's copy (``staging``, a host path) while the agent runs, after
    removing the copies nobody needs any more. Without ``staging`` (the agent run
    by hand, or by an engine that copies nothing to the host) there is nothing to do."""
    if not staging:
        yield None
        return
    own = host.path(staging)
    if own.parent.parent != host.path(STAGING_ROOT):
        raise StagingError(
            f"{STAGING_ENV}={staging} is not a copy under {STAGING_ROOT}/<namespace>.<module>/",
            staging=staging,
        )
    own.mkdir(parents=True, exist_ok=True)
    fd = os.open(own / CLAIM, os.O_RDWR | os.O_CREAT, 0o644)
    stop = threading.Event()
    try:
        # A pruner holds a claim only while it checks and removes a copy it
        # found idle for a day; this copy is touched on every start, so it waits little.
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not (own / CLAIM).exists():
            raise StagingError(
                f"this pod's copy of the module image ({staging}) was removed after a day "
                "unused; delete the pod and the engine makes a new one",
                staging=staging,
            )
        os.utime(fd)
        threading.Thread(target=_keep_touching, args=(fd, stop), daemon=True).start()
        removed = prune(host.path(STAGING_ROOT), keep=own, now=time.time())
        if removed:
            log.info("staging.pruned", copies=[host.host_view(p) for p in removed])
        yield own
    finally:
        stop.set()
        os.close(fd)


def _keep_touching(fd: int, stop: threading.Event) -> None:
    while not stop.wait(TOUCH_SECONDS):
        with contextlib.suppress(OSError):
            os.utime(fd)


def prune(root: Path, *, keep: Path, now: float, idle: float = IDLE_SECONDS) -> list[Path]:
    """Remove the copies under ``root`` that no agent holds and that were not touched
    for ``idle`` seconds; ``keep`` is the caller's own."""
    removed = []
    for module in _children(root):
        for copy in _children(module):
            if copy != keep and _last_touched(copy) < now - idle and _remove_if_free(copy):
                removed.append(copy)
        with contextlib.suppress(OSError):
            module.rmdir()  # only when empty
    return removed


def release_module(own: Path) -> list[Path]:
    """After a successful unload: remove ``own`` and every copy of the same module whose
    agent has run and stopped. A copy without a claim belongs to a pod whose agent
    has not started (its init containers may be copying right now): it stays."""
    removed = [
        copy
        for copy in _children(own.parent)
        if copy != own and (copy / CLAIM).exists() and _remove_if_free(copy)
    ]
    shutil.rmtree(own, ignore_errors=True)
    with contextlib.suppress(OSError):
        own.parent.rmdir()
    return [*removed, own]


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _last_touched(copy: Path) -> float:
    claim = copy / CLAIM
    try:
        return (claim if claim.exists() else copy).stat().st_mtime
    except OSError:
        return time.time()  # vanishing as we look: someone else's business


def _remove_if_free(copy: Path) -> bool:
    """Remove ``copy`` unless an agent holds its claim (checked without waiting)."""
    try:
        fd = os.open(copy / CLAIM, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(copy, ignore_errors=True)
        return True
    finally:
        os.close(fd)
