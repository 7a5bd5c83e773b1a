"""An operator older than the CRDs (``helm rollback`` of the operator, CRDs kept): a policy
carrying fields this operator does not know is still served, mid-rollout included.

The newer CRD is ours with properties added. With a node cordoned mid-rollout, the fields are
set and the operator is replaced (killed, started again, as the rolled-back pod starts); it
ignores the fields, names them in a ``FieldsIgnored`` condition, and the rollout finishes and
uncordons the node.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.manifests import apply, wait_established
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install, manifests
from tests.integration.test_tt_support import (
    DRIVER,
    FakeBuilder,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    node_labels,
    operator_env,
    patch_policy,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

KMD = "driver.tenstorrent.com/kmd-version"
CRD_NAME = "tenstorrentdriverpolicies.driver.tenstorrent.com"


def _newer_crd() -> dict[str, Any]:
    """Our driver CRD as a later release might ship it: two more spec fields."""
    crd = copy.deepcopy(next(m for m in manifests() if m["metadata"]["name"] == CRD_NAME))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["maxSurgeNodes"] = {"type": "integer"}
    drain = spec["properties"]["upgradePolicy"]["properties"]["drain"]
    drain["properties"]["skipDaemonSets"] = {"type": "boolean"}
    return crd


@dataclass
class Fleet:
    tag: str
    """Label ttdg-test=<tag> on the nodes; the policy is drv-dg-<tag>."""
    nodes: list[str]
    builder: FakeBuilder
    operator: Operator
    namespace: str


@pytest.fixture
def fleet(dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path: Any) -> Iterator[Fleet]:
    tag = uuid.uuid4().hex[:6]
    nodes = [f"ttdg-{tag}-{i}" for i in range(2)]
    with tt_operator(kubeconfig, kube_api, tmp_path, builders_played=True) as (operator, namespace):
        add_fleet(dev_cluster, kube_api, nodes, {"ttdg-test": tag})
        builder = FakeBuilder(kube_api, namespace)
        try:
            yield Fleet(tag, nodes, builder, operator, namespace)
        finally:
            builder.stop()
            delete_policy(kube_api, DRIVER, f"drv-dg-{tag}")
            delete_nodes(kube_api, nodes)
            install(kube_api)  # the CRDs as this release generates them, for the next tests
        assert not builder.poller.errors, builder.poller.errors


def _conditions(kube_api: Any, policy: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status(kube_api, DRIVER, policy).get("conditions") or []}


def test_fields_this_operator_does_not_know_are_ignored_mid_rollout(
    kubeconfig: str, kube_api: Any, fleet: Fleet, tmp_path: Path
) -> None:
    tag, nodes, builder = fleet.tag, fleet.nodes, fleet.builder
    policy = f"drv-dg-{tag}"
    core = client.CoreV1Api(kube_api)
    create_policy(
        kube_api,
        DRIVER,
        demo_objects.driver_policy(
            policy, "2.8.0", {"ttdg-test": tag}, upgradePolicy={"drain": {"timeoutSeconds": 10}}
        ),
    )
    wait_until(
        lambda: all(node_labels(kube_api, n).get(KMD) == "2.8.0" for n in nodes),
        "tt-kmd 2.8.0 on both nodes",
    )

    # A rollout in flight: the first node is cordoned, its new builder still compiling.
    builder.building.update(nodes)
    patch_policy(kube_api, DRIVER, policy, {"spec": {"version": "2.9.0"}})
    cordoned = wait_until(
        lambda: [n for n in nodes if core.read_node(n).spec.unschedulable],
        "a node cordoned for 2.9.0",
    )

    newer = _newer_crd()
    apply(kube_api, newer)
    wait_established(kube_api, CRD_NAME)
    objects = client.CustomObjectsApi(kube_api)
    newer_fields = {"maxSurgeNodes": 2, "upgradePolicy": {"drain": {"skipDaemonSets": True}}}

    def stored() -> dict[str, Any] | None:
        # The apiserver serves a changed CRD schema a moment after the update; until then
        # it prunes the new fields.
        patch_policy(kube_api, DRIVER, policy, {"spec": newer_fields})
        obj = objects.get_cluster_custom_object(*DRIVER, policy)
        return obj if "maxSurgeNodes" in obj["spec"] else None

    wait_until(stored, "the newer fields stored")
    # The downgrade: the operator's pod is replaced by one that does not know the fields.
    fleet.operator.kill()
    with running_operator(
        kubeconfig, tmp_path / "older.log", **operator_env(fleet.namespace, builders_played=True)
    ):
        _served_with_fields_ignored(kube_api, fleet, policy, cordoned)


def _served_with_fields_ignored(
    kube_api: Any, fleet: Fleet, policy: str, cordoned: list[str]
) -> None:
    nodes, core = fleet.nodes, client.CoreV1Api(kube_api)

    def verdict() -> dict[str, dict[str, Any]] | None:
        conditions = _conditions(kube_api, policy)
        seen = "FieldsIgnored" in conditions or conditions["Ready"]["reason"] == "InvalidSpec"
        return conditions if seen else None

    conditions = wait_until(verdict, "the operator's verdict on the newer fields")
    assert conditions["Ready"]["reason"] != "InvalidSpec", conditions["Ready"]
    ignored = conditions["FieldsIgnored"]
    assert ignored["status"] == "True" and ignored["reason"] == "UnknownFields"
    assert "spec.maxSurgeNodes" in ignored["message"]
    assert "spec.upgradePolicy.drain.skipDaemonSets" in ignored["message"]

    fleet.builder.building.clear()
    wait_until(
        lambda: (
            all(node_labels(kube_api, n).get(KMD) == "2.9.0" for n in nodes)
            and not any(core.read_node(n).spec.unschedulable for n in nodes)
        ),
        f"2.9.0 on both nodes and {cordoned[0]} uncordoned",
        timeout=90,
    )
    wait_until(
        lambda: status(kube_api, DRIVER, policy)["summary"].get("upToDate") == 2,
        "both nodes up to date",
    )
