"""Run the real operator (``kmodkit run``) against a devcluster, for the demo and tests."""

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

from kmodkit_dev import procs
from kmodkit_dev.waiting import wait_until


class Operator:
    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, log: Path, metrics_port: int = 0
    ) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.metrics_port = metrics_port
        """Where its Prometheus metrics are served (0: not served)."""

    def metrics(self) -> str:
        """The metrics it serves now, as Prometheus text (OSError while it does not answer)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def health(self) -> dict[str, Any] | None:
        """The /healthz body, or None while it does not answer (an exit raises)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return dict(json.loads(r.read()))
        except OSError:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"operator exited ({self.proc.returncode}):\n{self.output()}"
                ) from None
            return None

    def wait_healthy(self, timeout: float = 60) -> None:
        try:
            wait_until(self.health, "the operator's health endpoint", timeout=timeout)
        except AssertionError as err:
            raise RuntimeError(f"{err}; its log ends:\n{self.output()}") from None

    def output(self) -> str:
        """The end of the log, for failure messages."""
        return self.logged()[-8000:]

    def logged(self) -> str:
        """The whole log: what a busy operator said a while ago is still in it."""
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: nothing is cleaned up on the way out."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code (killed if it does not stop in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def launch(kubeconfig: str | Path, log: Path, *args: str, **env: str) -> Operator:
    """Start ``kmodkit run`` (with extra ``args``), its output appended to ``log``."""
    return _start(kubeconfig, log, args, env, metrics_port=0)


def launch_with_metrics(kubeconfig: str | Path, log: Path, *args: str, **env: str) -> Operator:
    """``launch``, its metrics served on a port of its own (``Operator.metrics``)."""
    port = procs.free_port()
    return _start(kubeconfig, log, (*args, "--metrics-port", str(port)), env, port)


def _start(
    kubeconfig: str | Path,
    log: Path,
    args: tuple[str, ...],
    env: dict[str, str],
    metrics_port: int,
) -> Operator:
    port = procs.free_port()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "kmodkit"),
                "run",
                "--health-host",
                "127.0.0.1",
                "--health-port",
                str(port),
                *args,
            ],
            env={**os.environ, "KUBECONFIG": str(kubeconfig), **env},
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return Operator(proc, port, log, metrics_port)


@contextmanager
def running_operator(
    kubeconfig: str | Path, log: Path, *, wait_healthy: bool = True, **env: str
) -> Iterator[Operator]:
    """Start ``kmodkit run``, wait until it is healthy (unless told not to: an operator whose
    start-up is held back answers only later), stop it with SIGTERM afterwards. Its metrics
    are served: a test's wait that times out can say when its last pass was."""
    log.unlink(missing_ok=True)
    if "KMODKIT_METRICS_PORT" in env:  # the port chosen as the chart chooses it
        op = launch(kubeconfig, log, **env)
        op.metrics_port = int(env["KMODKIT_METRICS_PORT"])
    else:
        op = launch_with_metrics(kubeconfig, log, **env)
    try:
        if wait_healthy:
            op.wait_healthy()
        yield op
    finally:
        op.stop()


def token_kubeconfig(admin: Path, namespace: str, account: str, kube_api: Any, out: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``account`` with a TokenRequest
    token, nothing else: the operator as a Deployment runs, and as the audit log names it."""
    cfg = json.loads(admin.read_text())
    token = service_account_token(kube_api, namespace, account)
    cfg["users"] = [{"name": account, "user": {"token": token}}]
    cfg["contexts"][0]["context"]["user"] = account
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out


def service_account_token(kube_api: Any, namespace: str, account: str) -> str:
    """A TokenRequest token of ServiceAccount ``account``, valid for an hour."""
    from kubernetes import client

    core: Any = client.CoreV1Api(kube_api)
    request = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return str(request.status.token)
