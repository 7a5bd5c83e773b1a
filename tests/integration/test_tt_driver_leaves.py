"""A node that leaves a Tenstorrent driver policy mid-rollout, on a real control plane with the
real operator: relabelled out of the policy's selector while the rollout has it cordoned and
gated (evictions refused by a PodDisruptionBudget), it is uncordoned, its deploy gate restored
and the rollout's keys and claim removed, with a ``RolloutReleased`` Event on the node. One
relabelled out while its new driver is loading (``validating``) may be half-changed: it is kept
cordoned and claimed as ``failed`` (``LeftDuringChange``) until the admin uncordons it, and then
released the same way; deleting the policy releases such a node too, though no longer its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit.backends.tenstorrent import names
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    DRIVER,
    MERGE,
    FakeBuilder,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    label_node,
    node_labels,
    patch_policy,
    tt_operator,
)

pytestmark = pytest.mark.cluster

GATE = "tenstorrent.com/deploy.tt-telemetry"
KMD = "driver.tenstorrent.com/kmd-version"
SELECTOR = "ttlv-test"


@pytest.fixture(scope="module")
def env(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, FakeBuilder]]:
    with tt_operator(
        kubeconfig, kube_api, tmp_path_factory.mktemp("ttlv"), builders_played=True
    ) as (_, namespace):
        builder = FakeBuilder(kube_api, namespace)
        try:
            yield namespace, builder
        finally:
            builder.stop()
        assert not builder.poller.errors, builder.poller.errors


def _rollout_marks(kube_api: Any, node: str, keys: RolloutKeys) -> dict[str, str]:
    """The rollout's labels and annotations still on ``node``, and its claim."""
    meta = client.CoreV1Api(kube_api).read_node(node).metadata
    found = {k: v for k, v in (meta.labels or {}).items() if k.startswith(keys.state)}
    annotations = meta.annotations or {}
    found.update({k: v for k, v in annotations.items() if k.startswith(keys.state)})
    if HOLDER_ANNOTATION in annotations:
        found[HOLDER_ANNOTATION] = annotations[HOLDER_ANNOTATION]
    return found


def _cordoned(kube_api: Any, node: str) -> bool:
    return bool(client.CoreV1Api(kube_api).read_node(node).spec.unschedulable)


def _events(kube_api: Any, node: str, reason: str) -> list[Any]:
    found = client.CoreV1Api(kube_api).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={node}"
    )
    return [e for e in found.items if e.reason == reason]


def test_a_node_relabelled_out_mid_rollout_is_uncordoned_and_released(
    dev_cluster: Any, kube_api: Any, env: tuple[str, FakeBuilder]
) -> None:
    namespace, _ = env
    tag = uuid.uuid4().hex[:6]
    node, policy = f"ttlv-{tag}", f"drlv-{tag}"
    keys = RolloutKeys.for_policy(names.driver_policy_id(policy))
    add_fleet(dev_cluster, kube_api, [node], {SELECTOR: tag, GATE: "true"})
    apps, pdbs = client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api)
    try:
        create_policy(
            kube_api,
            DRIVER,
            demo_objects.driver_policy(
                policy, "2.8.0", {SELECTOR: tag}, upgradePolicy={"drain": {"timeoutSeconds": 600}}
            ),
        )
        wait_until(lambda: node_labels(kube_api, node).get(KMD) == "2.8.0", "2.8.0 loaded")
        # A device holder whose eviction a PodDisruptionBudget refuses: the rollout keeps
        # the node cordoned and gated in `evicting` for the drain's 600 s.
        apps.create_namespaced_deployment(namespace, demo_objects.device_holder(node))
        pdbs.create_namespaced_pod_disruption_budget(namespace, demo_objects.blocking_pdb(node))
        patch_policy(kube_api, DRIVER, policy, {"spec": {"version": "2.9.0"}})
        wait_until(
            lambda: (
                node_labels(kube_api, node).get(keys.state) == "evicting"
                and _cordoned(kube_api, node)
                and node_labels(kube_api, node).get(GATE) == "false"
            ),
            "the node cordoned and gated, its evictions refused",
            timeout=90,
        )
        assert _rollout_marks(kube_api, node, keys).get(HOLDER_ANNOTATION) == keys.holder_id

        label_node(kube_api, node, {SELECTOR: None})  # out of the policy's selector
        wait_until(
            lambda: not _cordoned(kube_api, node) and not _rollout_marks(kube_api, node, keys),
            "the node uncordoned, the rollout's keys and claim gone",
            timeout=60,
        )
        assert node_labels(kube_api, node).get(GATE) == "true", "deploy gate not restored"
        assert node_labels(kube_api, node).get(KMD) == "2.8.0", "the driver was swapped"
        released = wait_until(
            lambda: _events(kube_api, node, "RolloutReleased"), "a RolloutReleased Event"
        )
        assert "released from evicting, uncordoned" in released[0].message
    finally:
        delete_policy(kube_api, DRIVER, policy)
        pdbs.delete_namespaced_pod_disruption_budget(f"pdb-{node}", namespace)
        apps.delete_namespaced_deployment(f"holder-{node}", namespace)
        delete_nodes(kube_api, [node])


def test_a_node_relabelled_out_while_its_driver_loads_is_kept_until_uncordoned(
    dev_cluster: Any, kube_api: Any, env: tuple[str, FakeBuilder]
) -> None:
    _, builder = env
    tag = uuid.uuid4().hex[:6]
    node, policy = f"ttlv-{tag}", f"drlv-{tag}"
    keys = RolloutKeys.for_policy(names.driver_policy_id(policy))
    add_fleet(dev_cluster, kube_api, [node], {SELECTOR: tag, GATE: "true"})
    try:
        create_policy(
            kube_api, DRIVER, demo_objects.driver_policy(policy, "2.8.0", {SELECTOR: tag})
        )
        wait_until(lambda: node_labels(kube_api, node).get(KMD) == "2.8.0", "2.8.0 loaded")
        builder.building.add(node)  # the new builder compiles 2.9.0 and reports nothing yet
        patch_policy(kube_api, DRIVER, policy, {"spec": {"version": "2.9.0"}})
        wait_until(
            lambda: node_labels(kube_api, node).get(keys.state) == "validating",
            "the swap made, the new driver loading",
            timeout=90,
        )

        label_node(kube_api, node, {SELECTOR: None})
        wait_until(
            lambda: node_labels(kube_api, node).get(keys.state) == "failed",
            "the node failed: it left during its change",
            timeout=60,
        )
        marks = _rollout_marks(kube_api, node, keys)
        assert marks[keys.reason] == "LeftDuringChange", marks
        assert marks[HOLDER_ANNOTATION] == keys.holder_id, "the claim was dropped"
        assert _cordoned(kube_api, node), "a possibly half-changed node was uncordoned"
        assert node_labels(kube_api, node).get(GATE) == "false", "the gate was restored"
        wait_until(lambda: _events(kube_api, node, "LeftDuringChange"), "a LeftDuringChange Event")

        # The admin has looked at the node, and uncordons it: the rollout lets it go.
        client.CoreV1Api(kube_api).patch_node(
            node, {"spec": {"unschedulable": None}}, _content_type=MERGE
        )
        wait_until(
            lambda: not _rollout_marks(kube_api, node, keys),
            "the rollout's keys and claim gone",
            timeout=60,
        )
        assert not _cordoned(kube_api, node)
        assert node_labels(kube_api, node).get(GATE) == "true", "deploy gate not restored"
    finally:
        builder.building.discard(node)
        delete_policy(kube_api, DRIVER, policy)
        delete_nodes(kube_api, [node])


def test_deleting_the_policy_releases_a_node_it_kept_after_it_left(
    dev_cluster: Any, kube_api: Any, env: tuple[str, FakeBuilder]
) -> None:
    _, builder = env
    tag = uuid.uuid4().hex[:6]
    node, policy = f"ttlv-{tag}", f"drlv-{tag}"
    keys = RolloutKeys.for_policy(names.driver_policy_id(policy))
    add_fleet(dev_cluster, kube_api, [node], {SELECTOR: tag, GATE: "true"})
    try:
        create_policy(
            kube_api, DRIVER, demo_objects.driver_policy(policy, "2.8.0", {SELECTOR: tag})
        )
        wait_until(lambda: node_labels(kube_api, node).get(KMD) == "2.8.0", "2.8.0 loaded")
        builder.building.add(node)
        patch_policy(kube_api, DRIVER, policy, {"spec": {"version": "2.9.0"}})
        wait_until(
            lambda: node_labels(kube_api, node).get(keys.state) == "validating",
            "the swap made, the new driver loading",
            timeout=90,
        )
        label_node(kube_api, node, {SELECTOR: None})
        wait_until(
            lambda: node_labels(kube_api, node).get(keys.state) == "failed",
            "the node failed: it left during its change",
            timeout=60,
        )
        # No longer one of the policy's nodes, it is still released with the policy.
        delete_policy(kube_api, DRIVER, policy)
        wait_until(
            lambda: not _cordoned(kube_api, node) and not _rollout_marks(kube_api, node, keys),
            "the node uncordoned, the rollout's keys and claim gone",
            timeout=60,
        )
        assert node_labels(kube_api, node).get(GATE) == "true", "deploy gate not restored"
    finally:
        builder.building.discard(node)
        delete_policy(kube_api, DRIVER, policy)
        delete_nodes(kube_api, [node])
