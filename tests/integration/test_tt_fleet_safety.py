"""Fleet safety of the driver rollout, on a real control plane with the real operator process.

Four kwok nodes: two healthy, one that goes down (kwok stops playing its kubelet and the node
reports NotReady) and one an admin cordons. A new version reaches the two healthy nodes, one at a
time; the down node is reported ``NodeNotReady`` and never started; the admin's node keeps its
builder pod and its cordon and is reported ``ExternalCordon``. Once the down node is back it is
upgraded too, and the admin's node is still left alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit.core.rollout.keys import ROLLOUT_PREFIX
from kmodkit.core.rollout.states import IN_FLIGHT
from kmodkit_dev.nodes import set_down
from kmodkit_dev.operator import Operator
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    BUILDER_SELECTOR,
    DRIVER,
    FIRMWARE,
    FakeBuilder,
    Poller,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    node_labels,
    patch_policy,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

KMD = "driver.tenstorrent.com/kmd-version"


class Fleet:
    def __init__(self, kube_api: Any, namespace: str, tag: str, operator: Operator) -> None:
        self.api = kube_api
        self.operator = operator
        self.core = client.CoreV1Api(kube_api)
        self.namespace = namespace
        self.tag = tag
        self.healthy = [f"ttfs-{tag}-{i}" for i in range(2)]
        self.down = f"ttfs-{tag}-down"
        self.admin = f"ttfs-{tag}-admin"
        self.policy = f"fs-{tag}"
        self.state_label = f"rollout.kmodkit.io/ttdp.{self.policy}"

    @property
    def nodes(self) -> list[str]:
        return [*self.healthy, self.down, self.admin]

    def entries(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in status(self.api, DRIVER, self.policy).get("nodes", [])}

    def reported(self, node: str) -> tuple[str, str]:
        entry = self.entries().get(node) or {}
        return entry.get("state", ""), entry.get("reason", "")

    def builders(self) -> dict[str, str]:
        """The builder pod UID on each node."""
        return {
            p.spec.node_name: p.metadata.uid
            for p in self.core.list_namespaced_pod(
                self.namespace, label_selector=BUILDER_SELECTOR
            ).items
            if p.spec.node_name and not p.metadata.deletion_timestamp
        }

    def at(self, version: str, nodes: list[str]) -> bool:
        return all(node_labels(self.api, n).get(KMD) == version for n in nodes)

    def uncordoned(self, nodes: list[str]) -> bool:
        return not any(self.core.read_node(n).spec.unschedulable for n in nodes)

    def ready(self, node: str) -> bool:
        conditions = self.core.read_node(node).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def explain(self, nodes: list[str]) -> str:
        """What each node looked like, and what the operator last logged of it: what a
        timed-out wait reports."""
        pods: dict[str, list[str]] = {}
        for p in self.core.list_namespaced_pod(
            self.namespace, label_selector=BUILDER_SELECTOR
        ).items:
            ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            gone = " deleting" if p.metadata.deletion_timestamp else ""
            pods.setdefault(p.spec.node_name or "", []).append(
                f"{p.metadata.name} {p.status.phase} ready={ready}{gone}"
            )
        logged = self.operator.logged().splitlines()
        said = []
        for name in nodes:
            node = self.core.read_node(name)
            labels = node.metadata.labels or {}
            # Every rollout's state and claim, this policy's or any other's.
            rollouts = {
                k: v
                for k, v in {**labels, **(node.metadata.annotations or {})}.items()
                if k.startswith(ROLLOUT_PREFIX)
            }
            said.append(
                f"{name}: {KMD}={labels.get(KMD)} rollouts={rollouts} "
                f"ready={self.ready(name)} unschedulable={bool(node.spec.unschedulable)} "
                f"taints={[(t.key, t.effect) for t in node.spec.taints or []]} "
                f"reported={self.entries().get(name)} builders={pods.get(name, [])} "
                f"operator said last={[line for line in logged if name in line][-3:]}"
            )
        custom = client.CustomObjectsApi(self.api)
        policies = [
            f"{kind[2]}/{p['metadata']['name']}"
            + (" deleting" if p["metadata"].get("deletionTimestamp") else "")
            for kind in (DRIVER, FIRMWARE)
            for p in custom.list_cluster_custom_object(*kind)["items"]
        ]
        return "\n".join([*said, f"policies in the cluster: {policies}"])

    def take_down(self, node: str) -> None:
        set_down(self.core, node, True)

    def bring_back(self, node: str) -> None:
        set_down(self.core, node, False)


class Watcher:
    """Independent of the operator: how many nodes were in flight at once, and every builder
    pod and cordon the nodes left alone had while the watcher ran."""

    def __init__(self, f: Fleet, left_alone: list[str]) -> None:
        self.f = f
        self.left_alone = left_alone
        self.max_in_flight = 0
        self.builders_seen: dict[str, set[str]] = {n: set() for n in left_alone}
        self.admin_uncordoned = False
        self.states_seen: dict[str, set[str]] = {n: set() for n in left_alone}
        self.poller = Poller(self._tick, 0.1)

    def _tick(self) -> None:
        nodes = {
            n.metadata.name: n
            for n in self.f.core.list_node(label_selector=f"ttfs-test={self.f.tag}").items
        }
        states = {n: (o.metadata.labels or {}).get(self.f.state_label) for n, o in nodes.items()}
        self.max_in_flight = max(self.max_in_flight, sum(s in IN_FLIGHT for s in states.values()))
        builders = self.f.builders()
        for node in self.left_alone:
            self.states_seen[node].add(states.get(node) or "idle")
            if node in builders:
                self.builders_seen[node].add(builders[node])
        if not nodes[self.f.admin].spec.unschedulable:
            self.admin_uncordoned = True

    def stop(self) -> None:
        self.poller.stop()
        assert not self.poller.errors, self.poller.errors


@pytest.fixture(scope="module")
def fleet(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    tag = uuid.uuid4().hex[:6]
    with tt_operator(
        kubeconfig, kube_api, tmp_path_factory.mktemp("ttfs"), builders_played=True
    ) as (op, namespace):
        f = Fleet(kube_api, namespace, tag, op)
        add_fleet(dev_cluster, kube_api, f.nodes, {"ttfs-test": tag})
        builder = FakeBuilder(kube_api, namespace)
        try:
            yield f
        finally:
            builder.stop()
            delete_policy(kube_api, DRIVER, f.policy)
            delete_nodes(kube_api, f.nodes)
        assert not builder.poller.errors, builder.poller.errors


def test_down_and_admin_cordoned_nodes_are_left_alone_and_the_rest_upgraded(fleet: Fleet) -> None:
    f = fleet
    create_policy(
        f.api,
        DRIVER,
        {
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": f.policy},
            "spec": {
                "version": "2.8.0",
                "nodeAffinity": {"matchLabels": {"ttfs-test": f.tag}},
                "upgradePolicy": {"drain": {"timeoutSeconds": 10}},
            },
        },
    )
    wait_until(
        lambda: f.at("2.8.0", f.nodes),
        "tt-kmd 2.8.0 everywhere",
        timeout=90,
        explain=lambda: f.explain(f.nodes),
    )

    f.take_down(f.down)
    f.core.patch_node(f.admin, {"spec": {"unschedulable": True}})  # kubectl cordon
    wait_until(lambda: not f.ready(f.down), "the down node NotReady")
    before = f.builders()
    watcher = Watcher(f, [f.down, f.admin])
    try:
        patch_policy(f.api, DRIVER, f.policy, {"spec": {"version": "2.9.0"}})
        wait_until(
            lambda: f.at("2.9.0", f.healthy) and f.uncordoned(f.healthy),
            "2.9.0 on the healthy nodes",
            timeout=120,
            explain=lambda: f.explain(f.healthy),
        )
        wait_until(
            lambda: (
                f.reported(f.down) == ("Pending", "NodeNotReady")
                and f.reported(f.admin) == ("Pending", "ExternalCordon")
            ),
            "the nodes left alone reported",
            timeout=30,
            explain=lambda: f.explain([f.down, f.admin]),
        )
    finally:
        watcher.stop()
    entries = f.entries()
    assert "once it is Ready again" in entries[f.down]["message"]
    assert "upgradeCordonedNodes" in entries[f.admin]["message"]
    assert watcher.max_in_flight == 1, "more than one node in flight at once"
    for node in (f.down, f.admin):
        assert watcher.builders_seen[node] == {before[node]}, f"{node}: its builder was replaced"
        assert watcher.states_seen[node] <= {"idle", "done", "required"}, watcher.states_seen
        assert node_labels(f.api, node)[KMD] == "2.8.0"
        assert node_labels(f.api, node)[f.state_label] == "required"
    assert not watcher.admin_uncordoned and f.core.read_node(f.admin).spec.unschedulable
    wait_until(
        lambda: (
            (s := status(f.api, DRIVER, f.policy)["summary"])["upToDate"] == 2
            and (s["pending"], s["failed"]) == (2, 0)
        ),
        "status: two up to date, two pending",
    )

    # The down node comes back and is upgraded; the admin's node still is not.
    watcher = Watcher(f, [f.admin])
    try:
        f.bring_back(f.down)
        wait_until(
            lambda: f.at("2.9.0", [f.down]) and f.uncordoned([f.down]),
            "2.9.0 on the node that came back",
            timeout=120,
            explain=lambda: f.explain([f.down]),
        )
        wait_until(
            lambda: f.reported(f.down) == ("Done", "Ready"),
            "the node reported Done",
            explain=lambda: f.explain([f.down]),
        )
    finally:
        watcher.stop()
    assert watcher.builders_seen[f.admin] == {before[f.admin]}
    assert not watcher.admin_uncordoned and f.core.read_node(f.admin).spec.unschedulable
    assert f.reported(f.admin) == ("Pending", "ExternalCordon")
    assert node_labels(f.api, f.admin)[KMD] == "2.8.0"
