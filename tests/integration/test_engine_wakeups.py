"""A Module's passes are woken by the nodes it concerns only, on the real operator.

Two Modules over two halves of a kwok fleet, converged. Relabelling the nodes of one
again and again runs passes over it and none over the other: the other's last pass, as
the operator's metrics time it, does not move. In a fleet of many Modules, or one whose
nodes another controller keeps relabelling, a Module pays for its own nodes only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import launch_with_metrics
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.integration.passes import last_pass, settled

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
KERNEL = "6.8.0-45-generic"
LABEL = "wake-test"

pytestmark = pytest.mark.cluster


@pytest.fixture
def halves(dev_cluster: devcluster.Cluster) -> Iterator[dict[str, tuple[str, list[str]]]]:
    """Two nodes for Module ``a``, two for ``b``: each half's selector value, and its nodes."""
    tag = uuid.uuid4().hex[:6]
    halves = {h: (f"{tag}-{h}", [f"wk-{tag}-{h}-{i}" for i in range(2)]) for h in ("a", "b")}
    devcluster.add_nodes(
        dev_cluster,
        [node_manifest(n, KERNEL, {LABEL: v}) for v, nodes in halves.values() for n in nodes],
    )
    yield halves
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for _, nodes in halves.values():
        for node in nodes:
            core.delete_node(node)


def _module(name: str, selector: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": name},
        "spec": {
            "selector": {LABEL: selector},
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": name},
                    "kernelMappings": [{"literal": KERNEL, "containerImage": image}],
                }
            },
        },
    }


def test_relabelling_one_modules_nodes_runs_no_pass_over_another(
    kube_api: Any,
    kubeconfig: str,
    namespace: str,
    oci_registry: Registry,
    halves: dict[str, tuple[str, list[str]]],
    tmp_path: Path,
) -> None:
    install(kube_api)
    core: Any = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(namespace, oci_registry.pull_secret("pull"))
    image = f"{oci_registry.host}/kmods/wake:{KERNEL}"
    oci_registry.push(image)
    op = launch_with_metrics(
        kubeconfig,
        tmp_path / "operator.log",
        KMODKIT_REGISTRY_CA=str(oci_registry.ca),
        KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:test",
    )
    try:
        op.wait_healthy()
        objects = client.CustomObjectsApi(kube_api)
        for half, (selector, _) in halves.items():
            objects.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _module(half, selector, image)
            )
        for half, (_, nodes) in halves.items():
            ready = f"kmm.node.kubernetes.io/{namespace}.{half}.ready"
            wait_until(
                lambda nodes=nodes, ready=ready: all(
                    ready in core.read_node(n).metadata.labels for n in nodes
                ),
                f"Module {half} loaded on its nodes",
                timeout=120,
            )
        a, b = f"{namespace}/a", f"{namespace}/b"
        a_before, b_before = settled(op, PLURAL, a), settled(op, PLURAL, b)
        assert a_before and b_before, "no pass over a Module was timed"

        for i in range(5):
            for node in halves["b"][1]:
                core.patch_node(node, {"metadata": {"labels": {"wake-test-churn": str(i)}}})
            time.sleep(0.5)
        wait_until(lambda: last_pass(op, PLURAL, b) > b_before, "a pass over b", timeout=30)
        time.sleep(2)  # time for a stray pass over a to show
        assert last_pass(op, PLURAL, a) == a_before, "b's nodes woke a pass over a"
    finally:
        op.stop()
