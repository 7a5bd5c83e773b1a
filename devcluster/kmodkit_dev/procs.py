"""Start, identify and stop the local processes devcluster runs.

Processes run in their own session so they outlive ``kmodkit dev up``; their
pids are written to the cluster's state file. Before signalling a pid we check
that it still runs the binary we started, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port_free(port: int, timeout: float = 30.0) -> None:
    """Until nothing holds 127.0.0.1:``port``. A port a killed server listened on may be
    taken meanwhile as the local end of some client's connection (it lies in the
    ephemeral range); such connections are short-lived."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.2)


def spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def runs(pid: int, binary: str) -> bool:
    """True when ``pid`` is alive and is the executable ``binary``."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return os.path.basename(exe.removesuffix(" (deleted)")) == os.path.basename(binary)


def stop(pid: int, binary: str, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; a no-op for a gone process."""
    if not runs(pid, binary):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not runs(pid, binary) or is_zombie(pid):
            reap(pid)
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    reap(pid)


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def reap(pid: int) -> None:
    # Only our own children can be reaped; for others this is a harmless error.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
