"""Which driver policy changes reload tt-kmd, and what reloads it, on a real control plane.

Three kwok nodes with the real operator process; ``FakeBuilder`` stands in for the builder's
node side (nothing runs inside a kwok pod). Toggling ``forceUnload`` changes no node's state and
replaces no pod; a new builder image with the same tt-kmd restarts the builders one at a time
without cordoning, draining or reloading anything; a builder recreated outside the rollout on a
node with another tt-kmd loaded waits for the rollout to cordon and drain the node; a builder
crash-looping outside a rollout is replaced once ``forceUnload`` is set.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit.core.rollout.states import IN_FLIGHT
from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.operator import Operator, launch_with_metrics
from kmodkit_dev.waiting import wait_until
from tests.integration.passes import last_pass
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
    operator_env,
    patch_policy,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

KMD = "driver.tenstorrent.com/kmd-version"
HASH = "driver.tenstorrent.com/template-hash"
NEW_IMAGE = "ghcr.io/kmodkit/tenstorrent-builder:0.1.1"
CONTROLLER = "tenstorrent.tenstorrentdriverpolicies"


class Fleet:
    def __init__(self, kube_api: Any, namespace: str, tag: str, op: Operator) -> None:
        self.api = kube_api
        self.op = op
        self.core = client.CoreV1Api(kube_api)
        self.namespace = namespace
        self.tag = tag
        self.nodes = [f"ttc-{tag}-{i}" for i in range(3)]
        self.policy = f"chg-{tag}"
        self.state_label = f"rollout.kmodkit.io/ttdp.{self.policy}"

    def status(self) -> dict[str, Any]:
        return status(self.api, DRIVER, self.policy)

    def builders(self) -> dict[str, Any]:
        """The live builder pod of each node."""
        return {
            p.spec.node_name: p
            for p in self.core.list_namespaced_pod(
                self.namespace, label_selector=BUILDER_SELECTOR
            ).items
            if p.spec.node_name and not p.metadata.deletion_timestamp
        }

    def explain(self) -> str:
        """What a stuck wait needs to be understood from CI's output alone: each node's
        rollout labels, its builder, the policy's node states, and the operator's last pass."""
        pods = self.builders()
        nodes = []
        for name in self.nodes:
            labels = node_labels(self.api, name)
            pod = pods.get(name)
            builder = (
                {
                    "uid": pod.metadata.uid[:8],
                    "image": pod.spec.containers[0].image,
                    "hash": (pod.metadata.annotations or {}).get(HASH),
                    "ready": [c.status for c in pod.status.conditions or [] if c.type == "Ready"],
                    "phase": pod.status.phase,
                }
                if pod is not None
                else None
            )
            state = labels.get(self.state_label)
            nodes.append(f"{name}: state={state} kmd={labels.get(KMD)} builder={builder}")
        policy = client.CustomObjectsApi(self.api).get_cluster_custom_object(*DRIVER, self.policy)
        s = policy.get("status") or {}
        states = [(e.get("name"), e.get("state"), e.get("reason")) for e in s.get("nodes", [])]
        passed = last_pass(self.op, CONTROLLER, self.policy)
        return (
            f"{'; '.join(nodes)}; policy nodes {states}, summary {s.get('summary')}, "
            f"generation {policy['metadata'].get('generation')} observed "
            f"{s.get('observedGeneration')}; last pass {time.time() - passed:.1f}s ago"
        )

    def uids(self) -> dict[str, str]:
        return {n: p.metadata.uid for n, p in self.builders().items()}

    def converged(self, version: str) -> bool:
        s = self.status()
        ready = {c["type"]: c["status"] for c in s.get("conditions", [])}.get("Ready")
        return (
            all(node_labels(self.api, n).get(KMD) == version for n in self.nodes)
            and s.get("summary", {}).get("upToDate") == len(self.nodes)
            and ready == "True"
            and not any(self.core.read_node(n).spec.unschedulable for n in self.nodes)
        )


class Watcher:
    """Independent of the operator: nodes ever cordoned or in the rollout's hands, and how many
    nodes at once had no Ready builder."""

    def __init__(self, f: Fleet) -> None:
        self.f = f
        self.cordoned: set[str] = set()
        self.in_flight: set[str] = set()
        self.max_unavailable = 0
        self.pods_seen: dict[str, set[str]] = {}
        self.poller = Poller(self._tick, 0.1)

    def _tick(self) -> None:
        for name in self.f.nodes:
            node = self.f.core.read_node(name)
            if node.spec.unschedulable:
                self.cordoned.add(name)
            if (node.metadata.labels or {}).get(self.f.state_label) in IN_FLIGHT:
                self.in_flight.add(name)
        pods = self.f.builders()
        for node, pod in pods.items():
            self.pods_seen.setdefault(node, set()).add(pod.metadata.uid)
        unavailable = [
            n
            for n in self.f.nodes
            if n not in pods
            or not any(
                c.type == "Ready" and c.status == "True" for c in pods[n].status.conditions or []
            )
        ]
        self.max_unavailable = max(self.max_unavailable, len(unavailable))

    def stop(self) -> None:
        self.poller.stop()
        assert not self.poller.errors, self.poller.errors


@pytest.fixture(scope="module")
def fleet(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Fleet, FakeBuilder]]:
    tag = uuid.uuid4().hex[:6]
    log_dir = tmp_path_factory.mktemp("ttc")
    with tt_operator(kubeconfig, kube_api, log_dir, builders_played=True) as (op, namespace):
        f = Fleet(kube_api, namespace, tag, op)
        add_fleet(dev_cluster, kube_api, f.nodes, {"ttc-test": tag})
        builder = FakeBuilder(kube_api, namespace)
        apps = client.AppsV1Api(kube_api)
        try:
            create_policy(
                kube_api,
                DRIVER,
                {
                    "apiVersion": "driver.tenstorrent.com/v1alpha1",
                    "kind": "TenstorrentDriverPolicy",
                    "metadata": {"name": f.policy},
                    "spec": {
                        "version": "2.8.0",
                        "nodeAffinity": {"matchLabels": {"ttc-test": tag}},
                        "upgradePolicy": {
                            "drain": {
                                "timeoutSeconds": 10,
                                "podSelectorLabel": f"app={demo_objects.HOLDER_APP}",
                            }
                        },
                    },
                },
            )
            wait_until(lambda: f.converged("2.8.0"), "tt-kmd 2.8.0 everywhere", timeout=60)
            # Workloads using the device: a reload evicts them, a builder restart must not.
            for node in f.nodes:
                apps.create_namespaced_deployment(namespace, demo_objects.device_holder(node))
            yield f, builder
        finally:
            builder.stop()
            delete_policy(kube_api, DRIVER, f.policy)
            delete_nodes(kube_api, f.nodes)
            if f.op is not op:  # started by a test in place of a killed one
                f.op.stop()
        assert not builder.poller.errors, builder.poller.errors


def _holder_uids(f: Fleet) -> dict[str, str]:
    return {
        p.spec.node_name: p.metadata.uid
        for p in f.core.list_namespaced_pod(
            f.namespace, label_selector=f"app={demo_objects.HOLDER_APP}"
        ).items
        if p.spec.node_name and not p.metadata.deletion_timestamp
    }


def test_toggling_force_unload_is_not_a_new_target(fleet: tuple[Fleet, FakeBuilder]) -> None:
    f, _ = fleet
    before = f.uids()
    for force in (True, False):
        patch_policy(f.api, DRIVER, f.policy, {"spec": {"upgradePolicy": {"forceUnload": force}}})
        gen = client.CustomObjectsApi(f.api).get_cluster_custom_object(*DRIVER, f.policy)[
            "metadata"
        ]["generation"]
        wait_until(lambda g=gen: f.status().get("observedGeneration") == g, "the change observed")
        deadline = time.monotonic() + 12  # a few passes of the operator
        while time.monotonic() < deadline:
            s = f.status()
            states = {n["name"]: n["state"] for n in s.get("nodes", [])}
            assert s["summary"]["upToDate"] == 3, states
            assert {c["type"]: c["status"] for c in s["conditions"]}["Ready"] == "True", s
            assert set(states.values()) <= {"Done"}, states
            time.sleep(1)
    assert f.uids() == before, "no builder pod is replaced for forceUnload alone"


def test_new_image_with_the_same_kmd_restarts_builders_without_draining(
    fleet: tuple[Fleet, FakeBuilder],
) -> None:
    f, builder = fleet
    wait_until(lambda: len(_holder_uids(f)) == 3, "device holders running")
    holders = _holder_uids(f)
    before = f.uids()
    watcher = Watcher(f)
    try:
        patch_policy(f.api, DRIVER, f.policy, {"spec": {"installer": {"image": NEW_IMAGE}}})
        wait_until(
            lambda: (
                all(p.spec.containers[0].image == NEW_IMAGE for p in f.builders().values())
                and len(f.builders()) == 3
                and f.converged("2.8.0")
            ),
            "every builder at the new image",
            timeout=90,
            explain=f.explain,
        )
    finally:
        watcher.stop()
    assert watcher.cordoned == set(), "a builder restart cordons nothing"
    assert watcher.in_flight == set(), "a builder restart is not a rollout"
    assert watcher.max_unavailable == 1, "builders are restarted one at a time"
    assert _holder_uids(f) == holders, "no workload is evicted"
    assert builder.reloads == [], "tt-kmd is not reloaded"
    after = f.uids()
    assert all(after[n] != before[n] for n in f.nodes)
    ds = client.AppsV1Api(f.api).read_namespaced_daemon_set(f"ttdrv-{f.policy}", f.namespace)
    digest = ds.metadata.annotations[HASH]
    assert all(p.metadata.annotations[HASH] == digest for p in f.builders().values())


def test_builder_recreated_outside_the_rollout_waits_for_it(
    fleet: tuple[Fleet, FakeBuilder],
) -> None:
    f, builder = fleet
    back = f.nodes[0]
    label_node(f.api, back, {"driver.tenstorrent.com/skip": "true"})
    wait_until(lambda: back not in f.builders(), "the skipped node's builder gone")
    patch_policy(f.api, DRIVER, f.policy, {"spec": {"version": "2.9.0"}})
    wait_until(
        lambda: all(
            (labels := node_labels(f.api, n)).get(KMD) == "2.9.0"
            and labels.get(f.state_label) == "done"
            and not f.core.read_node(n).spec.unschedulable
            for n in f.nodes[1:]
        ),
        "2.9.0 on the others, rolled and uncordoned",
        timeout=120,
        explain=f.explain,
    )
    assert node_labels(f.api, back)[KMD] == "2.8.0"
    watcher = Watcher(f)
    try:
        label_node(f.api, back, {"driver.tenstorrent.com/skip": None})
        wait_until(lambda: f.converged("2.9.0"), "2.9.0 everywhere", timeout=120, explain=f.explain)
    finally:
        watcher.stop()
    assert watcher.cordoned == {back}, "the un-skipped node is reloaded under a cordon"
    assert [r for r in builder.reloads if r[0] == back] in (
        [(back, "swapping")],
        [(back, "validating")],
    ), builder.reloads

    # A deleted builder on a node that runs its version adopts the loaded tt-kmd.
    adopted = len(builder.adopted)
    watcher = Watcher(f)
    try:
        pod = f.builders()[f.nodes[1]]
        f.core.delete_namespaced_pod(pod.metadata.name, f.namespace)
        wait_until(
            lambda: (
                (p := f.builders().get(f.nodes[1])) is not None
                and p.metadata.uid != pod.metadata.uid
                and len(builder.adopted) > adopted
                and f.converged("2.9.0")
            ),
            "the recreated builder adopts 2.9.0",
            timeout=60,
            explain=f.explain,
        )
    finally:
        watcher.stop()
    assert watcher.cordoned == set() and watcher.in_flight == set()


def test_crash_looping_builder_outside_a_rollout_is_replaced_for_force_unload(
    fleet: tuple[Fleet, FakeBuilder],
) -> None:
    f, builder = fleet
    node = f.nodes[2]
    builder.refusing.add(node)
    try:
        pod = f.builders()[node]
        f.core.delete_namespaced_pod(pod.metadata.name, f.namespace)

        def state() -> tuple[str, str]:
            entry = next((e for e in f.status().get("nodes", []) if e["name"] == node), {})
            return entry.get("state", ""), entry.get("reason", "")

        wait_until(
            lambda: state() == ("Failed", "BuilderCrashLoop"),
            "crash-looping",
            timeout=60,
            explain=f.explain,
        )
        assert node_labels(f.api, node).get(f.state_label) in (None, "done")
        crashing = f.builders()[node].metadata.uid
        watcher = Watcher(f)
        try:
            patch_policy(
                f.api, DRIVER, f.policy, {"spec": {"upgradePolicy": {"forceUnload": True}}}
            )
            wait_until(
                lambda: (
                    (p := f.builders().get(node)) is not None
                    and p.metadata.uid != crashing
                    and state()[0] == "Done"
                ),
                "the crash-looping builder replaced with forceUnload",
                timeout=60,
                explain=f.explain,
            )
        finally:
            watcher.stop()
        env = {e.name: e.value for e in f.builders()[node].spec.containers[0].env}
        assert env["TT_FORCE_UNLOAD"] == "true"
        assert watcher.cordoned == set()
    finally:
        builder.refusing.discard(node)


def test_builder_restarts_carry_on_after_an_operator_kill(
    fleet: tuple[Fleet, FakeBuilder], kubeconfig: str
) -> None:
    """The operator started in place of the killed one serves the tests after this one."""
    f, builder = fleet
    image = NEW_IMAGE.replace("0.1.1", "0.1.2")
    before = f.uids()
    reloads = len(builder.reloads)
    watcher = Watcher(f)
    try:
        patch_policy(f.api, DRIVER, f.policy, {"spec": {"installer": {"image": image}}})
        wait_until(
            lambda: sum(1 for n, u in f.uids().items() if u != before.get(n)) == 1,
            "the first builder restarted",
            timeout=60,
            explain=f.explain,
        )
        f.op.kill()  # SIGKILL mid-roll: what it did is only in the pods
        f.op = launch_with_metrics(
            kubeconfig, f.op.log, **operator_env(f.namespace, builders_played=True)
        )
        f.op.wait_healthy()
        wait_until(
            lambda: (
                all(p.spec.containers[0].image == image for p in f.builders().values())
                and len(f.builders()) == 3
                and f.converged("2.9.0")
            ),
            "every builder at the new image after the restart",
            timeout=90,
            explain=f.explain,
        )
    finally:
        watcher.stop()
    assert watcher.max_unavailable == 1, "still one builder at a time"
    assert watcher.cordoned == set() and watcher.in_flight == set()
    assert all(len(watcher.pods_seen[n]) == 2 for n in f.nodes), watcher.pods_seen
    assert builder.reloads[reloads:] == [], "tt-kmd is not reloaded"
