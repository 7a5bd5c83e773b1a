"""The Tenstorrent driver policy on a real control plane, with the real operator process.

Four kwok nodes: three container-managed and one with DKMS. The policy builds
tt-kmd everywhere it may; version changes then roll strictly one node at a
time (an independent Node watcher checks it), with deploy gates flipped and
restored and device holders evicted before each swap; a PodDisruptionBudget
fails a node with EvictionBlocked and halts the rollout; a surviving holder
makes the builder crash-loop until forceUnload; pause and the skip label hold
nodes back; the DKMS node is taken over once vacated.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import audit
from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.pki import ADMIN_TOKEN_USER
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    BUILDER_SELECTOR,
    DRIVER,
    FakeBuilder,
    Poller,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    label_node,
    node_labels,
    patch_policy,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

GATE = "tenstorrent.com/deploy.tt-telemetry"
INSTALL_MODE = "driver.tenstorrent.com/install-mode"
KMD = "driver.tenstorrent.com/kmd-version"


class Fleet:
    def __init__(self, kube_api: Any, namespace: str, tag: str) -> None:
        self.api = kube_api
        self.namespace = namespace
        self.tag = tag
        self.nodes = [f"ttd-{tag}-{i}" for i in range(3)]
        self.dkms_node = f"ttd-{tag}-dkms"
        self.policy = f"drv-{tag}"
        self.core = client.CoreV1Api(kube_api)

    @property
    def all_nodes(self) -> list[str]:
        return [*self.nodes, self.dkms_node]

    def status(self) -> dict[str, Any]:
        return status(self.api, DRIVER, self.policy)

    def node_states(self) -> dict[str, tuple[str, str]]:
        return {n["name"]: (n["state"], n["reason"]) for n in self.status().get("nodes", [])}


@pytest.fixture(scope="module")
def fleet(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Fleet, FakeBuilder]]:
    tag = uuid.uuid4().hex[:6]
    with tt_operator(
        kubeconfig, kube_api, tmp_path_factory.mktemp("ttd"), builders_played=True
    ) as (_, namespace):
        f = Fleet(kube_api, namespace, tag)
        # Telemetry runs where its gate label is "true", the contract of deploy gates.
        add_fleet(dev_cluster, kube_api, f.all_nodes, {"ttd-test": tag, GATE: "true"})
        builder = FakeBuilder(kube_api, namespace)
        builder.dkms.add(f.dkms_node)
        try:
            yield f, builder
        finally:
            builder.stop()
            delete_policy(kube_api, DRIVER, f.policy)
            delete_nodes(kube_api, f.all_nodes)
        assert not builder.poller.errors, builder.poller.errors


def _holders(f: Fleet) -> None:
    """One Deployment per node whose pod holds /dev/tenstorrent, and a telemetry DaemonSet."""
    apps = client.AppsV1Api(f.api)
    for node in f.nodes:
        apps.create_namespaced_deployment(f.namespace, demo_objects.device_holder(node))
    apps.create_namespaced_daemon_set(
        f.namespace, demo_objects.telemetry_daemonset({"ttd-test": f.tag})
    )


def _running_on(f: Fleet, selector: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in f.core.list_namespaced_pod(f.namespace, label_selector=selector).items:
        if (
            pod.spec.node_name
            and not pod.metadata.deletion_timestamp
            and pod.status.phase == "Running"
        ):
            counts[pod.spec.node_name] = counts.get(pod.spec.node_name, 0) + 1
    return counts


class Watcher:
    """Independent of the operator: how many of the nodes are cordoned at once, whether a
    builder pod went away while a device holder still ran there, and the gate then."""

    def __init__(self, f: Fleet) -> None:
        self.f = f
        self.max_cordoned = 0
        self.cordoned_ever: set[str] = set()
        self.gates_at_swap: list[str | None] = []
        self.swapped_under_holder: list[str] = []
        self._builders: dict[str, str] = {}
        self.poller = Poller(self._tick, 0.1)

    def _tick(self) -> None:
        nodes = {
            n.metadata.name: n
            for n in self.f.core.list_node(label_selector=f"ttd-test={self.f.tag}").items
        }
        cordoned = [n for n, o in nodes.items() if o.spec.unschedulable]
        self.max_cordoned = max(self.max_cordoned, len(cordoned))
        self.cordoned_ever.update(cordoned)
        holders = _running_on(self.f, f"app={demo_objects.HOLDER_APP}")
        builders = {
            p.spec.node_name: p.metadata.name
            for p in self.f.core.list_namespaced_pod(
                self.f.namespace, label_selector=BUILDER_SELECTOR
            ).items
            if p.spec.node_name and not p.metadata.deletion_timestamp
        }
        for node, pod in self._builders.items():
            # The DKMS node's standby builder is restarted outside the rollout: not a swap.
            if builders.get(node) != pod and node in self.f.nodes:
                self.gates_at_swap.append((nodes[node].metadata.labels or {}).get(GATE))
                if holders.get(node):
                    self.swapped_under_holder.append(node)
        self._builders = builders

    def stop(self) -> None:
        self.poller.stop()
        assert not self.poller.errors, self.poller.errors


def _all_at(f: Fleet, version: str, nodes: list[str] | None = None) -> bool:
    return all(node_labels(f.api, n).get(KMD) == version for n in nodes or f.nodes)


def _uncordoned(f: Fleet) -> bool:
    return not any(f.core.read_node(n).spec.unschedulable for n in f.all_nodes)


def test_install_then_one_node_at_a_time_upgrades(
    fleet: tuple[Fleet, FakeBuilder], dev_cluster: Any
) -> None:
    f, _ = fleet
    create_policy(
        f.api,
        DRIVER,
        {
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": f.policy},
            "spec": {
                "version": "2.8.0",
                "nodeAffinity": {"matchLabels": {"ttd-test": f.tag}},
                "upgradePolicy": {
                    "drain": {
                        "timeoutSeconds": 10,
                        "podSelectorLabel": f"app={demo_objects.HOLDER_APP}",
                    }
                },
            },
        },
    )
    wait_until(lambda: _all_at(f, "2.8.0"), "tt-kmd 2.8.0 on the container nodes", timeout=60)
    s = wait_until(
        lambda: (s := f.status()).get("summary", {}).get("upToDate") == 4 and s,
        "status: 3 done + 1 host-managed",
        timeout=30,
    )
    assert s["summary"]["hostManaged"] == 1 and s["summary"]["ready"] == 3
    assert f.node_states()[f.dkms_node] == ("HostManaged", "HostManagedKMD")
    assert {c["type"]: c["reason"] for c in s["conditions"]}["Ready"] == "AllReady"
    ds = client.AppsV1Api(f.api).read_namespaced_daemon_set(f"ttdrv-{f.policy}", f.namespace)
    assert ds.spec.update_strategy.type == "OnDelete"
    env = {e.name: e.value for e in ds.spec.template.spec.containers[0].env}
    assert env["TT_KMD_VERSION"] == "2.8.0" and env["HTTPS_PROXY"] == "http://proxy.example:3128"
    first_hash = ds.metadata.annotations["driver.tenstorrent.com/template-hash"]
    # Each owned object applied once over the whole install, however many passes it took:
    # a pass applies only what the cache shows differing (the apiserver's own count).
    applies = Counter(
        (r["objectRef"]["resource"], r["objectRef"]["name"])
        for r in audit.requests(dev_cluster.log("audit"), ADMIN_TOKEN_USER)
        if r.get("verb") == "patch"
        and r["objectRef"].get("namespace") == f.namespace
        and r["objectRef"].get("resource") in ("daemonsets", "configmaps")
    )
    assert ("daemonsets", f"ttdrv-{f.policy}") in applies
    assert set(applies.values()) == {1}, applies

    _holders(f)
    wait_until(
        lambda: (
            len(_running_on(f, f"app={demo_objects.HOLDER_APP}")) == 3
            and len(_running_on(f, "app=tt-telemetry")) == 4
        ),
        "holders and telemetry running",
    )

    watcher = Watcher(f)
    try:
        patch_policy(f.api, DRIVER, f.policy, {"spec": {"version": "2.9.0"}})
        wait_until(lambda: _all_at(f, "2.9.0") and _uncordoned(f), "2.9.0 everywhere", timeout=120)
    finally:
        watcher.stop()
    assert watcher.max_cordoned == 1, "more than one node was upgraded at once"
    assert watcher.cordoned_ever == set(f.nodes), "the DKMS node must not be touched"
    assert watcher.swapped_under_holder == []
    assert watcher.gates_at_swap == ["false"] * 3, "telemetry must be gated off during the swap"
    for n in f.all_nodes:
        assert node_labels(f.api, n)[GATE] == "true", "deploy gate not restored"
    assert node_labels(f.api, f.dkms_node).get(KMD) is None
    ds = client.AppsV1Api(f.api).read_namespaced_daemon_set(f"ttdrv-{f.policy}", f.namespace)
    assert ds.metadata.annotations["driver.tenstorrent.com/template-hash"] != first_hash
    wait_until(lambda: f.status().get("summary", {}).get("upToDate") == 4, "status converged")


def test_pdb_blocked_eviction_fails_the_node_and_halts(fleet: tuple[Fleet, FakeBuilder]) -> None:
    f, _ = fleet
    policy_api = client.PolicyV1Api(f.api)
    for node in f.nodes:
        policy_api.create_namespaced_pod_disruption_budget(
            f.namespace, demo_objects.blocking_pdb(node)
        )
    patch_policy(f.api, DRIVER, f.policy, {"spec": {"version": "2.10.0"}})

    def failed_node() -> str | None:
        failed = [n for n, (state, _) in f.node_states().items() if state == "Failed"]
        return failed[0] if failed else None

    node = wait_until(failed_node, "a node failed by the PDB", timeout=60)
    wait_until(lambda: f.node_states()[node][1] == "EvictionBlocked", "reason EvictionBlocked")
    s = f.status()
    entry = next(e for e in s["nodes"] if e["name"] == node)
    assert f"holder-{node}" in entry["message"]
    assert s["summary"]["failed"] == 1
    assert {c["type"]: c["reason"] for c in s["conditions"]}["Progressing"] == "Halted"
    others = [n for n in f.nodes if n != node]
    assert all(f.node_states()[n] == ("Pending", "RolloutHalted") for n in others)
    assert f.core.read_node(node).spec.unschedulable, "a failed node stays cordoned"

    # The admin relaxes the budgets and retries the node: the rollout finishes.
    for n in f.nodes:
        policy_api.delete_namespaced_pod_disruption_budget(f"pdb-{n}", f.namespace)
    label_node(f.api, node, {"rollout.kmodkit.io/ttdp." + f.policy: None})
    wait_until(lambda: _all_at(f, "2.10.0") and _uncordoned(f), "2.10.0 everywhere", timeout=120)


def test_surviving_holder_crash_loops_until_force_unload(fleet: tuple[Fleet, FakeBuilder]) -> None:
    f, builder = fleet
    held = f.nodes[1]
    builder.held.add(held)
    patch_policy(
        f.api,
        DRIVER,
        f.policy,
        {"spec": {"version": "2.11.0", "upgradePolicy": {"drain": {"enable": False}}}},
    )
    wait_until(
        lambda: f.node_states().get(held) == ("Failed", "BuilderCrashLoop"),
        "the held node's builder crash-looping",
        timeout=90,
    )
    s = f.status()
    entry = next(e for e in s["nodes"] if e["name"] == held)
    assert "pid 4242 (tt-smi)" in entry["message"]
    assert s["summary"]["failed"] == 1
    assert node_labels(f.api, held)[KMD] == "2.10.0", "the old driver stays loaded"

    patch_policy(f.api, DRIVER, f.policy, {"spec": {"upgradePolicy": {"forceUnload": True}}})
    wait_until(lambda: _all_at(f, "2.11.0") and _uncordoned(f), "2.11.0 everywhere", timeout=90)
    builder.held.discard(held)
    wait_until(lambda: f.status().get("summary", {}).get("failed") == 0, "no failed node")


def _control_map(f: Fleet) -> dict[str, str]:
    return dict(f.core.read_namespaced_config_map(f"ttdrv-{f.policy}", f.namespace).data or {})


def _builder_pods(f: Fleet) -> dict[str, str]:
    return {
        p.spec.node_name: p.metadata.name
        for p in f.core.list_namespaced_pod(f.namespace, label_selector=BUILDER_SELECTOR).items
        if p.spec.node_name and not p.metadata.deletion_timestamp
    }


def test_pause_and_skip_hold_nodes_back(fleet: tuple[Fleet, FakeBuilder]) -> None:
    f, _ = fleet
    patch_policy(f.api, DRIVER, f.policy, {"spec": {"version": "2.12.0", "paused": True}})
    wait_until(
        lambda: (
            {c["type"]: c["reason"] for c in f.status()["conditions"]}.get("Progressing")
            == "Paused"
        ),
        "Progressing=Paused",
    )
    wait_until(
        lambda: all(f.node_states()[n] == ("Pending", "Paused") for n in f.nodes),
        "nodes waiting on the pause",
    )
    assert _uncordoned(f) and _all_at(f, "2.11.0")
    # The pause reaches the builders that already run through their control map.
    builders = _builder_pods(f)
    wait_until(lambda: _control_map(f) == {"paused": "true"}, "the control map says paused")
    assert _builder_pods(f) == builders, "pausing replaces no builder"
    pod = f.core.read_namespaced_pod(next(iter(builders.values())), f.namespace)
    volumes = {v.name: v.config_map.name for v in pod.spec.volumes if v.config_map}
    assert volumes == {"policy": f"ttdrv-{f.policy}"}

    skipped = f.nodes[2]
    label_node(f.api, skipped, {"driver.tenstorrent.com/skip": "true"})
    patch_policy(f.api, DRIVER, f.policy, {"spec": {"paused": False}})
    wait_until(lambda: _control_map(f) == {"paused": "false"}, "the control map says unpaused")
    wait_until(
        lambda: _all_at(f, "2.12.0", f.nodes[:2]) and _uncordoned(f),
        "2.12.0 on the others",
        timeout=90,
    )
    assert node_labels(f.api, skipped)[KMD] == "2.11.0"
    assert f.node_states()[skipped] == ("Skipped", "Skipped")
    assert f.status()["summary"]["skipped"] == 1
    label_node(f.api, skipped, {"driver.tenstorrent.com/skip": None})
    wait_until(lambda: _all_at(f, "2.12.0") and _uncordoned(f), "2.12.0 everywhere", timeout=60)


def test_vacated_dkms_node_is_taken_over_under_cordon_and_drain(
    fleet: tuple[Fleet, FakeBuilder],
) -> None:
    f, builder = fleet
    node = f.dkms_node
    # An earlier test turned the drain off (with it off, a takeover only cordons).
    patch_policy(f.api, DRIVER, f.policy, {"spec": {"upgradePolicy": {"drain": {"enable": True}}}})
    client.AppsV1Api(f.api).create_namespaced_deployment(
        f.namespace, demo_objects.device_holder(node)
    )
    wait_until(lambda: _running_on(f, f"app={demo_objects.HOLDER_APP}").get(node) == 1, "holder")
    watcher = Watcher(f)
    try:
        # The vacate procedure removed the DKMS signals; the standby builder notices.
        standby = builder.vacate(node)
        wait_until(
            lambda: node_labels(f.api, node).get(INSTALL_MODE) == "container",
            "install-mode flips to container",
            timeout=90,
        )
        wait_until(
            lambda: f.node_states().get(node, ("",))[0] == "Done" and _uncordoned(f),
            "the node is Done and uncordoned",
            timeout=60,
        )
    finally:
        watcher.stop()
    assert node in watcher.cordoned_ever, "the takeover cordons the node"
    assert node not in watcher.swapped_under_holder, "the holder was evicted before the swap"
    assert standby not in _builder_pods(f).values()
    assert "driver.tenstorrent.com/standby-pod" not in node_labels(f.api, node)
    s = f.status()["summary"]
    assert s["hostManaged"] == 0 and s["ready"] == 4
