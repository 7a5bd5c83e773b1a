"""Each backend's policy on the control plane: the real operator (``kmodkit run``) brings a
kwok fleet to a TenstorrentDriverPolicy's version, then a TenstorrentFirmwarePolicy's, then
an Intel ClusterPolicy's driver (on the built-in engine), one after the other on the same
nodes, as one operator serves all three in a cluster that runs them.

For each: the time from creating the policy until its status says every node is done, the
operator's CPU over that time, its peak RSS, its writes by resource (the apiserver's audit
log) and its writes in the minute after. Then a SIGKILL and start with every policy converged,
and the writes of the 30 s after it.

Stand-in: kwok runs nothing inside a pod, so ``BuilderPlay`` writes the node labels each
Tenstorrent builder pod writes once it has loaded the driver (as the integration tests'
``FakeBuilder`` does), when kwok reports the pod Running. kwok completes the flash Jobs'
pods and makes the Intel loader and device plugin pods Ready.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from kmodkit.backends.tenstorrent.driver_api import DRIVER_CRD
from kmodkit.backends.tenstorrent.firmware_api import FIRMWARE_CRD
from kmodkit_dev.nodes import TENSTORRENT_LABELS
from kmodkit_dev.operator import Operator
from kmodkit_dev.tenstorrent_demo import (
    FLASHER_ACCOUNT,
    builder_report,
    driver_policy,
    firmware_policy,
    flasher_account,
)
from tests.bench.fleet import NS, SELECTOR, Fleet, _cpu_s, _rss_peak_mib, rollout_settings

DEFAULT_NODES = 1000
DRIVER_VERSION = "2.8.0"
FIRMWARE_VERSION = "19.4.0"
BUILDERS = "app.kubernetes.io/name=tt-kmd-installer"
IDLE_SECONDS = 60
RESTART_SECONDS = 30
OPERATOR_ENV = {
    "KMODKIT_NAMESPACE": NS,
    "KMODKIT_TT_SERVICE_ACCOUNT": "default",
    "KMODKIT_TT_FLASHER_SERVICE_ACCOUNT": FLASHER_ACCOUNT,
    "KMODKIT_INTEL_ENGINE": "builtin",
}


@dataclass
class BackendFigures:
    policy: str
    nodes: int
    converge_s: float = 0.0
    cpu_s: float = 0.0
    """The operator's CPU time while the policy converged."""
    peak_rss_mib: float = 0.0
    """The operator's peak RSS so far (the policies before this one still served)."""
    writes: dict[str, int] = field(default_factory=dict)
    idle_writes_per_min: float = 0.0

    @property
    def writes_per_node(self) -> float:
        return sum(self.writes.values()) / self.nodes


@dataclass
class Policy:
    """A policy to converge: what to create, and how its status says every node is done."""

    key: str
    """How ``BENCH_BACKENDS`` names it."""
    name: str
    group: str
    version: str
    plural: str
    body: dict[str, Any]
    done: Callable[[dict[str, Any], int], bool]


def _tt_done(version: str) -> Callable[[dict[str, Any], int], bool]:
    def done(status: dict[str, Any], n: int) -> bool:
        summary = status.get("summary") or {}
        return (
            status.get("desiredVersion") == version
            and summary.get("matched") == summary.get("upToDate") == n
            and not summary.get("inProgress")
        )

    return done


def _intel_done(status: dict[str, Any], n: int) -> bool:
    """Ready, with the driver loaded and the device plugin running on every node."""
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    full = f"{n}/{n}"
    return (
        conditions.get("Ready") == "True"
        and status.get("kmmStatus") == status.get("devicePluginStatus") == full
    )


def policies(image: str, budget: int) -> list[Policy]:
    """The three policies over the bench's nodes, the firmware flashed ``budget`` nodes at
    a time (the rollout step's maxUnavailable)."""
    cluster_policy = {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "bench"},
        "spec": {
            "resourceRegistration": "dp",
            "nodeSelector": SELECTOR,
            "pullSecret": {"name": "pull"},
            "kernelModule": {"kernelMappings": [{"regexp": ".", "containerImage": image}]},
        },
    }
    return [
        Policy(
            "driver",
            "TenstorrentDriverPolicy",
            DRIVER_CRD.group,
            DRIVER_CRD.version,
            DRIVER_CRD.plural,
            driver_policy("bench", DRIVER_VERSION, SELECTOR),
            _tt_done(DRIVER_VERSION),
        ),
        Policy(
            "firmware",
            "TenstorrentFirmwarePolicy",
            FIRMWARE_CRD.group,
            FIRMWARE_CRD.version,
            FIRMWARE_CRD.plural,
            firmware_policy(
                "bench", FIRMWARE_VERSION, SELECTOR, upgradePolicy={"maxParallel": budget}
            ),
            _tt_done(FIRMWARE_VERSION),
        ),
        Policy(
            "intel",
            "ClusterPolicy",
            "intel.com",
            "v1alpha1",
            "clusterpolicies",
            cluster_policy,
            _intel_done,
        ),
    ]


class BuilderPlay:
    """Stand-in for the builders' node side: once kwok reports a builder pod Running, the
    labels the real builder writes after loading the pod's tt-kmd version go on its node."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self._played: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(32)
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> BuilderPlay:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._pool.shutdown()

    def _follow(self) -> None:
        untyped: Any = watch
        while not self._stop.is_set():
            for event in untyped.Watch().stream(
                self.core.list_namespaced_pod,
                NS,
                label_selector=BUILDERS,
                timeout_seconds=5,
                deserialize=False,
            ):
                pod = event["object"]
                if event["type"] not in ("ADDED", "MODIFIED") or pod["metadata"]["uid"] in (
                    self._played
                ):
                    continue
                if (pod.get("status") or {}).get("phase") != "Running":
                    continue
                self._played.add(pod["metadata"]["uid"])
                env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
                labels = builder_report(env["TT_KMD_VERSION"], dkms=False)
                body = {"metadata": {"labels": labels}}
                self._pool.submit(self.core.patch_node, pod["spec"]["nodeName"], body)


def _status(objs: Any, policy: Policy) -> dict[str, Any]:
    obj = objs.get_cluster_custom_object(policy.group, policy.version, policy.plural, "bench")
    return dict(obj.get("status") or {})


def _converge(fleet: Fleet, op: Operator, policy: Policy) -> BackendFigures:
    figures = BackendFigures(policy.name, fleet.n)
    objs = client.CustomObjectsApi(fleet.api)
    fleet.audit.mark()
    cpu = _cpu_s(op.proc.pid)
    started = time.monotonic()
    objs.create_cluster_custom_object(policy.group, policy.version, policy.plural, policy.body)
    while not policy.done(status := _status(objs, policy), fleet.n):
        if time.monotonic() - started > max(900.0, fleet.n / 2):
            raise RuntimeError(f"{policy.name} not converged: {status}; see {op.log}")
        time.sleep(0.5)
    figures.converge_s = time.monotonic() - started
    figures.cpu_s = _cpu_s(op.proc.pid) - cpu
    figures.peak_rss_mib = _rss_peak_mib(op.proc.pid)
    time.sleep(5)  # the last Events and status of the pass
    figures.writes = fleet.audit.writes()
    fleet.audit.mark()
    time.sleep(IDLE_SECONDS)
    figures.idle_writes_per_min = sum(fleet.audit.writes().values()) * 60 / IDLE_SECONDS
    return figures


def chosen() -> set[str]:
    """The policies ``BENCH_BACKENDS`` names (comma separated; default all three:
    driver, firmware, intel)."""
    keys = set(os.environ.get("BENCH_BACKENDS", "driver,firmware,intel").split(","))
    if unknown := keys - {p.key for p in policies("", 1)}:
        raise ValueError(f"BENCH_BACKENDS: unknown {sorted(unknown)}; use driver, firmware, intel")
    return keys


def measure(n: int) -> tuple[list[BackendFigures], dict[str, int]]:
    """Each chosen policy's figures on one fresh fleet of ``n`` nodes, and the operator's
    writes in the 30 s after a SIGKILL and start with all of them converged."""
    budget, _ = rollout_settings()
    keys = chosen()
    fleet = Fleet(n, {**SELECTOR, **TENSTORRENT_LABELS})
    try:
        fleet.core.create_namespaced_service_account(NS, flasher_account())
        op = fleet.launch_operator(**OPERATOR_ENV)
        op.wait_healthy(timeout=120)
        try:
            with BuilderPlay(fleet.core):
                rows = [
                    _converge(fleet, op, p) for p in policies(fleet.image, budget) if p.key in keys
                ]
                op.kill()
                fleet.audit.mark()
                op = fleet.launch_operator(**OPERATOR_ENV)
                op.wait_healthy(timeout=120)
                time.sleep(RESTART_SECONDS)
                restart = fleet.audit.writes()
        finally:
            op.stop()
    finally:
        fleet.close()
    return rows, restart


def table(rows: list[BackendFigures], restart: dict[str, int]) -> str:
    lines = [
        "| policy | nodes | converges | operator CPU | peak RSS | writes/node | writes "
        "| idle writes/min (0) |",
        "|" + "---|" * 8,
    ]
    for f in rows:
        writes = ", ".join(f"{k} {v}" for k, v in sorted(f.writes.items()))
        lines.append(
            f"| {f.policy} | {f.nodes:,} | {f.converge_s:.1f} s | {f.cpu_s:.1f} s "
            f"| {f.peak_rss_mib:.0f} MiB | {f.writes_per_node:.2f} | {writes} "
            f"| {f.idle_writes_per_min:.0f} |"
        )
    lines.append("")
    lines.append(
        f"Writes in the {RESTART_SECONDS} s after a SIGKILL and start with every policy converged "
        f"(0): {sum(restart.values())}" + (f" ({restart})" if restart else "")
    )
    return "\n".join(lines)
