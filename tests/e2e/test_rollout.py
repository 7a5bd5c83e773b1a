"""The rollout core on a simulated fleet: a real apiserver, controller-manager,
scheduler and kwok nodes running real workloads, driven by a test loop
(``rollout_driver``) with simulated hooks. Crash safety of the real operator is
proven in tests/chaos, which kills ``kmodkit run`` itself.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.states import IN_FLIGHT
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.waiting import wait_until
from tests.e2e.rollout_driver import DEVICE_PATH, DEVICE_PODS_AT_SWAP, SWAPS, VERSION

REPO = Path(__file__).resolve().parents[2]
GATE = "tenstorrent.com/deploy.tt-telemetry"
SKIP = "driver.tenstorrent.com/skip"
TARGET = "2.8.0"


class Fleet:
    """kwok nodes of one test, tagged so the rollout and its workloads stay on them."""

    def __init__(self, kube_api: Any, dev_cluster: devcluster.Cluster, size: int) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.selector = f"rollout-e2e={self.tag}"
        self.names = [f"ro-{self.tag}-{i:02}" for i in range(size)]
        self.core = client.CoreV1Api(kube_api)
        self.policy_id = f"e2e-{self.tag}"
        self.keys = RolloutKeys.for_policy(self.policy_id)
        devcluster.add_nodes(
            dev_cluster,
            [
                node_manifest(n, "6.8.0-45-generic", {"rollout-e2e": self.tag, GATE: "true"})
                for n in self.names
            ],
        )

    def nodes(self) -> dict[str, Any]:
        return {n.metadata.name: n for n in self.core.list_node(label_selector=self.selector).items}

    def states(self) -> dict[str, str | None]:
        return {
            name: (n.metadata.labels or {}).get(self.keys.state) for name, n in self.nodes().items()
        }

    def delete(self) -> None:
        for n in self.names:
            self.core.delete_node(n)


@pytest.fixture
def fleet_factory(kube_api: Any, dev_cluster: devcluster.Cluster) -> Iterator[Any]:
    made: list[Fleet] = []

    def make(size: int) -> Fleet:
        made.append(Fleet(kube_api, dev_cluster, size))
        return made[-1]

    yield make
    for fleet in made:
        fleet.delete()


def _pod_spec(fleet: Fleet, device: bool, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"rollout-e2e": fleet.tag},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "busybox:1.36"}],
        **extra,
    }
    if device:
        spec["volumes"] = [{"name": "dev", "hostPath": {"path": DEVICE_PATH}}]
        spec["containers"][0]["volumeMounts"] = [{"name": "dev", "mountPath": DEVICE_PATH}]
    return spec


def _deployment(name: str, replicas: int, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def _pdb(name: str, **budget: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {**budget, "selector": {"matchLabels": {"app": name}}},
    }


def deploy_workloads(kube_api: Any, namespace: str, fleet: Fleet) -> str:
    """A realistic mix; returns the node the bare pod runs on."""
    apps, policy = client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api)
    telemetry = _pod_spec(fleet, device=True)
    telemetry["nodeSelector"] = {"rollout-e2e": fleet.tag, GATE: "true"}
    apps.create_namespaced_daemon_set(
        namespace,
        {
            "metadata": {"name": "telemetry"},
            "spec": {
                "selector": {"matchLabels": {"app": "telemetry"}},
                "template": {"metadata": {"labels": {"app": "telemetry"}}, "spec": telemetry},
            },
        },
    )
    apps.create_namespaced_deployment(namespace, _deployment("web", 16, _pod_spec(fleet, False)))
    policy.create_namespaced_pod_disruption_budget(namespace, _pdb("web", maxUnavailable=2))
    apps.create_namespaced_deployment(namespace, _deployment("trainer", 8, _pod_spec(fleet, True)))
    policy.create_namespaced_pod_disruption_budget(namespace, _pdb("trainer", minAvailable=6))
    bare_node = fleet.names[-1]
    fleet.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "scratch", "labels": {"app": "scratch"}},
            "spec": _pod_spec(fleet, False, nodeName=bare_node),
        },
    )
    wait_until(
        lambda: all(_ready(apps, namespace, d) for d in ("web", "trainer")),
        "the workloads to be ready",
        timeout=90,
    )
    wait_until(
        lambda: (
            apps.read_namespaced_daemon_set("telemetry", namespace).status.number_ready
            == len(fleet.names)
        ),
        "telemetry on every node",
        timeout=90,
    )
    return bare_node


def _ready(apps: client.AppsV1Api, namespace: str, name: str) -> bool:
    d = apps.read_namespaced_deployment(name, namespace)
    return (d.status.available_replicas or 0) == d.spec.replicas


class CordonWatcher:
    """An independent observer: a Node watch that tracks how many nodes count against
    the unavailability budget (cordoned, except those the rollout is done with) and
    how many are in flight, at every change it sees."""

    def __init__(self, core: client.CoreV1Api, fleet: Fleet) -> None:
        self.core, self.fleet = core, fleet
        self.cordoned: dict[str, bool] = {}
        self.in_flight: dict[str, bool] = {}
        self.max_cordoned = 0
        self.max_in_flight = 0
        self._stopping = threading.Event()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: len(self.cordoned) == len(fleet.names), "the watch to see the fleet")

    def _run(self) -> None:
        version = None
        while not self._stopping.is_set():
            try:
                for event in self._watch.stream(
                    self.core.list_node,
                    resource_version=version,
                    label_selector=self.fleet.selector,
                ):
                    version = event["object"].metadata.resource_version
                    self._see(event["type"], event["object"])
            except Exception:
                if self._stopping.is_set():
                    return
                # The apiserver ends watches now and then; a fresh watch starts by
                # listing every node again, so the counts stay right.
                version = None

    def _see(self, kind: str, node: Any) -> None:
        name = node.metadata.name
        gone = kind == "DELETED"
        state = (node.metadata.labels or {}).get(self.fleet.keys.state)
        # A node done but left cordoned by its admin no longer holds the budget.
        self.cordoned[name] = not gone and bool(node.spec.unschedulable) and state != "done"
        self.in_flight[name] = not gone and state in IN_FLIGHT
        self.max_cordoned = max(self.max_cordoned, sum(self.cordoned.values()))
        self.max_in_flight = max(self.max_in_flight, sum(self.in_flight.values()))

    def stop(self) -> None:
        self._stopping.set()
        self._watch.stop()


class Driver:
    """The rollout loop as a separate process, so a test can SIGKILL it."""

    def __init__(
        self,
        kubeconfig: str,
        fleet: Fleet,
        policy: dict[str, Any],
        status_file: Path,
        involved: dict[str, str] | None = None,
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "tests.e2e.rollout_driver",
            "--kubeconfig",
            kubeconfig,
            "--policy-id",
            fleet.policy_id,
            "--selector",
            fleet.selector,
            "--policy",
            json.dumps(policy),
            "--target",
            TARGET,
            "--skip-label",
            SKIP,
            "--status-file",
            str(status_file),
            "--interval",
            "0.2",
        ]
        if involved:
            self.argv += ["--involved", json.dumps(involved)]
        self.status_file = status_file
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, cwd=REPO)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_file.read_text()))
        except (OSError, ValueError):
            return {}

    def __enter__(self) -> Driver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


ROLLING = {
    "maxParallel": 3,
    "maxUnavailable": 3,
    # The fleet has a node an admin cordoned: upgraded under that cordon, which stays.
    "upgradeCordonedNodes": True,
    "deployGates": {GATE: "false"},
    "deviceEviction": {"timeoutSeconds": 90},
    "drain": {"enable": True, "podSelector": "app notin (scratch-free)", "timeoutSeconds": 90},
    "validationTimeoutSeconds": 30,
}


def _converged(fleet: Fleet) -> bool:
    return set(fleet.states().values()) == {"done"}


def assert_rolled_out(
    kube_api: Any,
    namespace: str,
    fleet: Fleet,
    external: str,
    bare_node: str,
    watcher: CordonWatcher,
) -> None:
    nodes = fleet.nodes()
    for name, node in nodes.items():
        annotations = node.metadata.annotations or {}
        assert (node.metadata.labels or {})[fleet.keys.state] == "done", name
        assert annotations[VERSION] == TARGET, name
        assert annotations[SWAPS] == "1", f"{name} was swapped {annotations[SWAPS]} times"
        assert annotations[DEVICE_PODS_AT_SWAP] == "0", f"{name} swapped under a device pod"
        assert node.metadata.labels[GATE] == "true", f"{name}: deploy gate not restored"
        assert bool(node.spec.unschedulable) == (name == external), name
    # The budget held at every instant the watcher saw, and was actually used.
    assert watcher.max_cordoned <= 3
    assert watcher.max_in_flight <= 3
    assert watcher.max_in_flight >= 2
    apps = client.AppsV1Api(kube_api)
    wait_until(
        lambda: (
            apps.read_namespaced_daemon_set("telemetry", namespace).status.number_ready
            == len(fleet.names)
        ),
        "telemetry back on every node",
    )
    wait_until(
        lambda: all(_ready(apps, namespace, d) for d in ("web", "trainer")),
        "the workloads to be whole again",
    )
    scratch = fleet.core.read_namespaced_pod("scratch", namespace)
    assert scratch.spec.node_name == bare_node and scratch.metadata.deletion_timestamp is None


def test_rollout_keeps_the_budget_and_finishes_every_node(
    kube_api: Any, kubeconfig: str, namespace: str, fleet_factory: Any, tmp_path: Path
) -> None:
    fleet = fleet_factory(20)
    bare_node = deploy_workloads(kube_api, namespace, fleet)
    external = fleet.names[5]
    fleet.core.patch_node(external, {"spec": {"unschedulable": True}})
    watcher = CordonWatcher(fleet.core, fleet)
    try:
        with Driver(kubeconfig, fleet, ROLLING, tmp_path / "status.json") as driver:
            wait_until(lambda: _converged(fleet), "every node to be done", timeout=150)
            # Converged: further passes read but write nothing.
            wait_until(
                lambda: driver.status().get("complete") and driver.status()["writes"] == 0,
                "an idle pass",
            )
            status = driver.status()
    finally:
        watcher.stop()
    assert_rolled_out(kube_api, namespace, fleet, external, bare_node, watcher)
    assert status["summary"]["upToDate"] == 20
    assert [(n["name"], n["reason"]) for n in status["nodes"]] == [(external, "ExternalCordon")]
    events = fleet.core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.name={fleet.names[0]},involvedObject.kind=Node"
    ).items
    reasons = {e.reason for e in events}
    assert {"RolloutCordoning", "RolloutEvicting", "RolloutSwapping", "RolloutDone"} <= reasons


def test_a_blocked_eviction_fails_the_node_halts_the_rollout_and_resumes_after_a_fix(
    kube_api: Any, kubeconfig: str, namespace: str, fleet_factory: Any, tmp_path: Path
) -> None:
    fleet = fleet_factory(4)
    blocked = fleet.names[0]
    apps, policy_api = client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api)
    spec = _pod_spec(fleet, True)
    spec["nodeSelector"]["kubernetes.io/hostname"] = blocked
    apps.create_namespaced_deployment(namespace, _deployment("pinned", 1, spec))
    policy_api.create_namespaced_pod_disruption_budget(namespace, _pdb("pinned", minAvailable=1))
    wait_until(lambda: _ready(apps, namespace, "pinned"), "the pinned workload")
    policy = {
        "maxParallel": 1,
        "maxUnavailable": 1,
        "haltOnFailure": True,
        "deviceEviction": {"timeoutSeconds": 3},
        "validationTimeoutSeconds": 30,
    }
    # Stands in for the backend's policy object, which receives events too.
    owner = fleet.core.create_namespaced_config_map(namespace, {"metadata": {"name": "policy"}})
    involved = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "policy",
        "namespace": namespace,
        "uid": owner.metadata.uid,
    }
    with Driver(kubeconfig, fleet, policy, tmp_path / "status.json", involved) as driver:
        wait_until(lambda: fleet.states()[blocked] == "failed", "the blocked node to fail")
        node = fleet.nodes()[blocked]
        annotations = node.metadata.annotations
        assert annotations[fleet.keys.reason] == "EvictionBlocked"
        assert f"{namespace}/pinned-" in annotations[fleet.keys.message]
        assert node.spec.unschedulable  # a failed node stays out of scheduling
        # Halted: for a while, no other node starts.
        wait_until(lambda: driver.status().get("halted"), "the rollout to report it halted")
        time.sleep(2)
        others = {n: s for n, s in fleet.states().items() if n != blocked}
        assert set(others.values()) == {"required"}
        assert not any(fleet.nodes()[n].spec.unschedulable for n in others)
        status = driver.status()
        assert status["nodes"][0]["name"] == blocked
        assert status["nodes"][0]["reason"] == "EvictionBlocked"
        assert {n["reason"] for n in status["nodes"][1:]} == {"RolloutHalted"}
        warnings = fleet.core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.name={blocked},type=Warning"
        ).items
        assert "EvictionBlocked" in {e.reason for e in warnings}
        on_policy = fleet.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=policy,type=Warning"
        ).items
        assert any(e.reason == "EvictionBlocked" and blocked in e.message for e in on_policy)

        # The admin relaxes the budget and clears the node's state to retry it.
        policy_api.patch_namespaced_pod_disruption_budget(
            "pinned", namespace, {"spec": {"minAvailable": 0}}
        )
        fleet.core.patch_node(blocked, {"metadata": {"labels": {fleet.keys.state: None}}})
        wait_until(lambda: _converged(fleet), "every node to be done", timeout=60)
    node = fleet.nodes()[blocked]
    assert not node.spec.unschedulable
    assert node.metadata.annotations[fleet.keys.attempt] == "2"
    assert node.metadata.annotations[SWAPS] == "1"
    wait_until(lambda: _ready(apps, namespace, "pinned"), "the pinned workload to come back")
