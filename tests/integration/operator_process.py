"""Run the real operator (``kmodkit run``) as a subprocess against the devcluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devcluster import procs
from tests.waiting import wait_until


class Operator:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return dict(json.loads(r.read()))
        except OSError:
            assert self.proc.poll() is None, f"operator exited:\n{self.output()}"
            return None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-8000:]


@contextmanager
def running_operator(kubeconfig: str, log: Path, **env: str) -> Iterator[Operator]:
    """Start ``kmodkit run``, wait until it is healthy, stop it with SIGTERM afterwards."""
    port = procs.free_port()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "kmodkit"), "run", "--health-host", "127.0.0.1",
             "--health-port", str(port)],
            env={**os.environ, "KUBECONFIG": kubeconfig, **env},
            stdout=fh, stderr=subprocess.STDOUT,
        )
    op = Operator(proc, port, log)
    try:
        wait_until(op.health, "the operator's health endpoint", timeout=60)
        yield op
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
