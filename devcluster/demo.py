"""``make demo``: kmodkit's operator on a local simulated fleet.

Starts a devcluster with a mixed Intel/Tenstorrent fleet of kwok nodes on
three kernels, shows it, runs the operator against it and reports what the
operator loaded, then shuts everything down (``--keep`` leaves the cluster up).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from devcluster import build, cluster, procs

NAME = "demo"


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def kubectl(c: cluster.Cluster, *args: str) -> None:
    subprocess.run(
        [str(build.binary("kubectl")), f"--kubeconfig={c.kubeconfig}", *args], check=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()

    step(f"starting a local control plane with {args.nodes} kwok nodes")
    c = cluster.up(NAME, nodes=args.nodes, profile="mixed")
    operator = None
    try:
        step("the simulated fleet: accelerators and kernels")
        kubectl(
            c,
            "get",
            "nodes",
            "-o",
            "wide",
            "-L",
            "intel.feature.node.kubernetes.io/gpu-pci,"
            "feature.node.kubernetes.io/pci-1200_1e52.present",
        )

        step("starting the kmodkit operator against it")
        port = procs.free_port()
        log = c.dir / "logs" / "operator.log"
        with open(log, "w") as fh:
            operator = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "kmodkit"),
                    "run",
                    "--health-host",
                    "127.0.0.1",
                    "--health-port",
                    str(port),
                ],
                env=dict(os.environ, KUBECONFIG=str(c.kubeconfig)),
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        health = _wait_health(port, operator)
        for name, state in health.get("backends", {}).items():
            print(f"    backend {name:12} {state}")
        print(f"    operator log: {log}")
        operator.send_signal(signal.SIGTERM)
        code = operator.wait(timeout=30)
        step(f"operator stopped cleanly (exit {code})")
        return 0 if code == 0 else 1
    finally:
        if operator is not None and operator.poll() is None:
            operator.kill()
        if args.keep:
            print(
                f"\ncluster left running: export KUBECONFIG={c.kubeconfig}; "
                f"stop it with: kmodkit dev down --name {NAME}"
            )
        else:
            cluster.down(NAME)


def _wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the operator exited during start-up; see its log above")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return dict(json.loads(r.read()))
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the operator did not answer its health probe in time")


if __name__ == "__main__":
    sys.exit(main())
