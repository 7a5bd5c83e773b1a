"""A Tenstorrent driver policy's passes are not woken by node labels it does not read, on
the real operator.

A paused driver policy (it starts no builder) over two host-managed kwok nodes (nothing to
roll, so no timed retry): only node changes and its own events wake it. Another controller's
labels (the Module engine's ready label, any other) changing on its nodes in ten rounds run no
pass over it, or as few as the shared cluster's other objects may (its last pass, as the
operator's metrics time it, sampled through the rounds). A label of its selector does."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit.backends.tenstorrent.keys import TT_INSTALL_MODE_LABEL
from kmodkit_dev import cluster as devcluster
from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.operator import launch_with_metrics
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.integration.passes import last_pass, settled
from tests.integration.test_tt_support import (
    DRIVER,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    label_node,
    operator_env,
    status,
)

pytestmark = pytest.mark.cluster
CONTROLLER = "tenstorrent.tenstorrentdriverpolicies"
ROUNDS = 10
BACKGROUND = 2
"""Passes other tests' objects may wake meanwhile (the cluster is shared: their nodes and
builder pods come and go, and any node added or removed wakes the policy); without the
policy's declaration the rounds woke one pass each, seen."""


def test_labels_a_driver_policy_does_not_read_run_no_pass_over_it(
    dev_cluster: devcluster.Cluster, kube_api: Any, kubeconfig: str, tmp_path: Path
) -> None:
    install(kube_api)
    core: Any = client.CoreV1Api(kube_api)
    namespace = f"tt-wake-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, demo_objects.flasher_account())
    tag = uuid.uuid4().hex[:6]
    nodes = [f"ttw-{tag}-{i}" for i in range(2)]
    policy = f"wake-{tag}"
    # Host-managed: nothing to roll, so no timed retry runs a pass either.
    add_fleet(dev_cluster, kube_api, nodes, {"ttw-pool": tag, TT_INSTALL_MODE_LABEL: "host"})
    op = launch_with_metrics(kubeconfig, tmp_path / "operator.log", **operator_env(namespace))
    try:
        op.wait_healthy()
        create_policy(
            kube_api,
            DRIVER,
            {
                "apiVersion": f"{DRIVER[0]}/{DRIVER[1]}",
                "kind": "TenstorrentDriverPolicy",
                "metadata": {"name": policy},
                "spec": {
                    "version": "2.9.0",
                    "paused": True,
                    "nodeAffinity": {"matchLabels": {"ttw-pool": tag}},
                },
            },
        )
        wait_until(
            lambda: status(kube_api, DRIVER, policy).get("summary", {}).get("matched") == 2,
            "the policy to see its nodes",
            timeout=60,
        )
        before = settled(op, CONTROLLER, policy)
        assert before, "no pass over the policy was timed"

        passes = {before}
        for i in range(ROUNDS):
            for node in nodes:
                label_node(
                    kube_api,
                    node,
                    {f"kmm.node.kubernetes.io/{namespace}.m.ready": "", "ttw-churn": str(i)},
                )
            for _ in range(5):  # 0.5 s a round: each pass it wakes ends within it
                time.sleep(0.1)
                passes.add(last_pass(op, CONTROLLER, policy))
        time.sleep(2)  # time for a stray pass to show
        passes.add(last_pass(op, CONTROLLER, policy))
        assert len(passes) - 1 <= BACKGROUND, f"labels it does not read woke {len(passes) - 1}"

        label_node(kube_api, nodes[0], {"ttw-pool": None})
        wait_until(
            lambda: last_pass(op, CONTROLLER, policy) > before, "a pass for its selector's label"
        )
        wait_until(
            lambda: status(kube_api, DRIVER, policy).get("summary", {}).get("matched") == 1,
            "the node relabelled out of the selector to leave the status",
        )
    finally:
        op.stop()
        delete_policy(kube_api, DRIVER, policy)
        delete_nodes(kube_api, nodes)
        core.delete_namespace(namespace, propagation_policy="Background")
