"""Drain pass 2 of the Tenstorrent driver on a real control plane, with the real operator.

``kubectl drain`` semantics as upstream tt-k8s-driver-manager has them: every
pod on the node is evicted except DaemonSet pods and the operator's own
namespace, where the operator itself and the flash Jobs run (a flash cut off
by a driver drain can brick a card). On kwok nothing runs in the pods: a
Deployment in the operator namespace stands for the operator's pod, and a Job
labelled as a flash Job (kept running by kwok) for a flash in progress.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_driver import KMD
from tests.integration.test_tt_support import (
    DRIVER,
    FakeBuilder,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    node_labels,
    patch_policy,
    tt_operator,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, FakeBuilder]]:
    with tt_operator(
        kubeconfig, kube_api, tmp_path_factory.mktemp("ttdrain"), builders_played=True
    ) as (_, namespace):
        builder = FakeBuilder(kube_api, namespace)
        try:
            yield namespace, uuid.uuid4().hex[:6], builder
        finally:
            builder.stop()
        assert not builder.poller.errors, builder.poller.errors


def _deployment(name: str, node: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
                },
            },
        },
    }


def _flash_job(name: str, node: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "tt-flasher", "kmodkit.io/simulate": "hang"}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "flash", "image": "registry.invalid/flash:1"}],
                },
            },
        },
    }


def _running_uids(core: client.CoreV1Api, namespace: str, selector: str) -> set[str]:
    return {
        p.metadata.uid
        for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    }


def test_pass_two_spares_the_operator_namespace(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str, FakeBuilder]
) -> None:
    namespace, tag, _ = env
    node = f"ttdr-{tag}"
    policy = f"drdrain-{tag}"
    work = f"work-{tag}"
    add_fleet(dev_cluster, kube_api, [node], {"ttdr-test": tag})
    core = client.CoreV1Api(kube_api)
    apps = client.AppsV1Api(kube_api)
    batch = client.BatchV1Api(kube_api)
    core.create_namespace({"metadata": {"name": work}})
    try:
        create_policy(
            kube_api,
            DRIVER,
            demo_objects.driver_policy(
                policy, "2.8.0", {"ttdr-test": tag}, upgradePolicy={"drain": {"timeoutSeconds": 15}}
            ),
        )
        wait_until(lambda: node_labels(kube_api, node).get(KMD) == "2.8.0", "2.8.0 loaded")
        apps.create_namespaced_deployment(work, _deployment("web", node))
        apps.create_namespaced_deployment(namespace, _deployment(f"operator-{tag}", node))
        batch.create_namespaced_job(namespace, _flash_job(f"flash-{tag}", node))
        selectors = {
            "workload": (work, "app=web"),
            "operator": (namespace, f"app=operator-{tag}"),
            "flash": (namespace, f"job-name=flash-{tag}"),
        }

        def all_running() -> dict[str, set[str]] | None:
            uids = {k: _running_uids(core, ns, sel) for k, (ns, sel) in selectors.items()}
            return uids if all(len(u) == 1 for u in uids.values()) else None

        before = wait_until(all_running, "the pods running", timeout=60)

        patch_policy(kube_api, DRIVER, policy, {"spec": {"version": "2.9.0"}})
        wait_until(
            lambda: (
                node_labels(kube_api, node).get(KMD) == "2.9.0"
                and not core.read_node(node).spec.unschedulable
            ),
            "2.9.0 loaded and the node uncordoned",
            timeout=120,
        )
        wait_until(
            lambda: _running_uids(core, work, "app=web") - before["workload"],
            "the workload evicted, and back once the node is uncordoned",
            timeout=60,
        )
        assert _running_uids(core, *selectors["operator"]) == before["operator"], (
            "pass 2 evicted the operator's own pod"
        )
        assert _running_uids(core, *selectors["flash"]) == before["flash"], (
            "pass 2 evicted a flash Job's pod"
        )
    finally:
        delete_policy(kube_api, DRIVER, policy)
        core.delete_namespace(work, propagation_policy="Background")
        apps.delete_namespaced_deployment(f"operator-{tag}", namespace)
        batch.delete_namespaced_job(f"flash-{tag}", namespace, propagation_policy="Background")
        delete_nodes(kube_api, [node])
