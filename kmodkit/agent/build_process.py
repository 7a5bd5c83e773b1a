"""Running a build: its output passed on line by line as it comes, its time bounded.

A first build (clone, ``make modules``) takes minutes; an admin following the
pod's log must see it move, and a clone that hangs behind a proxy must end with
a reason rather than hold the node forever. The build runs in its own process
group so the timeout stops the whole tree (git, make, the compilers), not only
the shell that started them: a child left behind would keep the output open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from kmodkit.agent.kmod import CommandResult

TIMED_OUT = 124
"""The exit code of a build stopped at its timeout (as coreutils ``timeout`` has it)."""
_KEPT_LINES = 200


class BuildRunner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        timeout: float,
        on_line: Callable[[str], None],
    ) -> CommandResult: ...


def run_streaming(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
    on_line: Callable[[str], None],
) -> CommandResult:
    """Run ``argv`` with stdout and stderr merged, calling ``on_line`` for each line
    as it is written; the result keeps the last lines."""
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=cwd,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found ({exc})")
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):  # it ended just now
            os.killpg(process.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    kept: deque[str] = deque(maxlen=_KEPT_LINES)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            text = line.rstrip("\n")
            kept.append(text)
            on_line(text)
        code = process.wait()
    finally:
        timer.cancel()
    output = "\n".join(kept)
    if timed_out.is_set():
        return CommandResult(tuple(argv), TIMED_OUT, output, f"timed out after {timeout:g}s")
    return CommandResult(tuple(argv), code, output, "")
