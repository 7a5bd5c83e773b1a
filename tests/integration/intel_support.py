"""What the Intel Xe integration tests share: the operator namespace, the operator, the
GPU nodes, and reading a ClusterPolicy's status."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.registry import Registry

CP_GROUP, CP_VERSION, CP_PLURAL = "intel.com", "v1alpha1", "clusterpolicies"


def operator_namespace(
    kube_api: Any,
    prefix: str,
    registry: Registry | None = None,
    labels: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A fresh operator namespace (with the registry's pull secret ``pull``), for a
    module-scoped fixture to ``yield from``; deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
    if registry is not None:
        core.create_namespaced_secret(name, registry.pull_secret("pull"))
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@contextmanager
def intel_operator(
    kubeconfig: str, log: Path, namespace: str, registry: Registry | None = None, **env: str
) -> Iterator[Operator]:
    """``kmodkit run`` serving ``namespace``, trusting the test registry, with ``env``."""
    settings = {
        "KMODKIT_NAMESPACE": namespace,
        "KMODKIT_AGENT_IMAGE": "registry.invalid/kmodkit/agent:test",
        **({"KMODKIT_REGISTRY_CA": str(registry.ca)} if registry is not None else {}),
        **env,
    }
    with running_operator(kubeconfig, log, **settings) as op:
        yield op


def gpu_nodes(
    cluster: devcluster.Cluster, names: list[str], kernels: list[str], tag: str
) -> Iterator[list[str]]:
    """kwok nodes labelled ``intel-test=<tag>``, one per kernel, for a fixture to ``yield from``."""
    devcluster.add_nodes(
        cluster,
        [node_manifest(n, k, {"intel-test": tag}) for n, k in zip(names, kernels, strict=True)],
    )
    yield names
    core = client.CoreV1Api(devcluster.api_client(cluster))
    for n in names:
        core.delete_node(n)


# The kernels of the test nodes (Ubuntu's 7.0 and 6.8).
TEST_KERNELS = "^(7[.]0[.]0|6[.]8[.]0)-.*-generic$"


def policy(
    name: str, tag: str, image: str, spec: Mapping[str, Any] | None = None, **kernel_module: Any
) -> dict[str, Any]:
    """A ClusterPolicy in dp mode for the nodes labelled ``intel-test=<tag>``, its driver
    image ``image`` for every test kernel (with ``kernel_module``'s fields, and ``spec``'s)."""
    mapping = {"regexp": TEST_KERNELS, "containerImage": image}
    return {
        "apiVersion": f"{CP_GROUP}/{CP_VERSION}",
        "kind": "ClusterPolicy",
        "metadata": {"name": name},
        "spec": {
            "resourceRegistration": "dp",
            "nodeSelector": {"intel-test": tag},
            "pullSecret": {"name": "pull"},
            "kernelModule": {"kernelMappings": [mapping], **kernel_module},
            **(spec or {}),
        },
    }


def policy_status(kube_api: Any, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube_api).get_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, name
    )
    return dict(obj.get("status") or {})
