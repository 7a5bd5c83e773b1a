"""An operator start never unloads a driver, whatever its node cache has seen yet.

The real operator (``kmodkit run``) converges a Module, is SIGKILLed, and a
new one starts behind a loopback proxy that holds back every request for
nodes: the race the review found (a first pass on a node cache still filling)
then happens on every run. While the nodes are held, and after they are
released, no loader pod may go, no unloader may appear and no label may move. The
operator's health endpoint answers while the nodes are held: a fleet that takes longer to
list than the liveness probe allows does not get the operator killed and started again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.api_proxy import api_proxy, server_of
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import running_operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
KERNEL = "6.8.0-45-generic"
HELD_SECONDS = 8.0

pytestmark = pytest.mark.cluster


@pytest.fixture
def nodes(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"restart-{tag}-{i}" for i in range(3)]
    devcluster.add_nodes(
        dev_cluster, [node_manifest(n, KERNEL, {"restart-test": tag}) for n in names]
    )
    yield tag, names
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for n in names:
        core.delete_node(n)


def _state(kube_api: Any, namespace: str, nodes: list[str], ready: str) -> dict[str, Any]:
    """What must not change: the loader pods (by UID), any unloader, the ready labels."""
    core = client.CoreV1Api(kube_api)
    pods = core.list_namespaced_pod(namespace).items
    return {
        "loaders": sorted(
            (p.metadata.name, p.metadata.uid, p.metadata.deletion_timestamp is None)
            for p in pods
            if (p.metadata.labels or {}).get("app.kubernetes.io/component") == "module-loader"
        ),
        "unloaders": sorted(
            p.metadata.name
            for p in pods
            if (p.metadata.labels or {}).get("app.kubernetes.io/component") == "module-unloader"
        ),
        "labelled": sorted(n for n in nodes if ready in (core.read_node(n).metadata.labels or {})),
    }


def test_a_restart_on_a_node_cache_still_filling_unloads_nothing(
    dev_cluster: devcluster.Cluster,
    kubeconfig: str,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    nodes: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    install(kube_api)
    tag, names = nodes
    image = f"{oci_registry.host}/kmods/restart:1"
    oci_registry.push(image)
    client.CoreV1Api(kube_api).create_namespaced_secret(namespace, oci_registry.pull_secret("pull"))
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": "restart"},
        "spec": {
            "selector": {"restart-test": tag},
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "kernelMappings": [{"literal": KERNEL, "containerImage": image}],
                }
            },
        },
    }
    ready = f"kmm.node.kubernetes.io/{namespace}.restart.ready"
    env = {
        "KMODKIT_REGISTRY_CA": str(oci_registry.ca),
        "KMODKIT_AGENT_IMAGE": "registry.invalid/kmodkit/agent:test",
    }
    with running_operator(kubeconfig, tmp_path / "first.log", **env) as first:
        client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body
        )
        wait_until(
            lambda: _state(kube_api, namespace, names, ready)["labelled"] == sorted(names),
            "the Module to converge",
        )
        converged = _state(kube_api, namespace, names, ready)
        first.proc.kill()  # SIGKILL: nothing is cleaned up on the way out
        first.proc.wait()
    assert len(converged["loaders"]) == len(names)

    with api_proxy(server_of(Path(kubeconfig)), dev_cluster.pki, held=("/api/v1/nodes",)) as proxy:
        proxied = proxy.kubeconfig(Path(kubeconfig), tmp_path / "proxied.kubeconfig")
        with running_operator(
            proxied, tmp_path / "second.log", wait_healthy=False, **env
        ) as second:
            # The Module and its pods are visible to it; its nodes are not.
            deadline = threading.Event()
            # Held at least HELD_SECONDS, and until it has asked for the nodes (a loaded
            # machine starts the operator slowly).
            started = time.monotonic()
            while time.monotonic() - started < HELD_SECONDS or proxy.held_requests == 0:
                assert _state(kube_api, namespace, names, ready) == converged, second.output()
                assert time.monotonic() - started < 180, "the operator never asked for the nodes"
                deadline.wait(0.5)
            second.wait_healthy()  # the nodes still held
            proxy.release()
            for _ in range(10):
                assert _state(kube_api, namespace, names, ready) == converged, second.output()
                deadline.wait(0.5)
            # Still serving: a node joining the Module's selector gets its loader pod.
            joined = f"restart-{tag}-3"
            devcluster.add_nodes(
                dev_cluster, [node_manifest(joined, KERNEL, {"restart-test": tag})]
            )
            try:
                wait_until(
                    lambda: (
                        ready
                        in (client.CoreV1Api(kube_api).read_node(joined).metadata.labels or {})
                    ),
                    "the restarted operator to load a joining node",
                )
            finally:
                client.CoreV1Api(kube_api).delete_node(joined)
            objects = client.CustomObjectsApi(kube_api)
            objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "restart")
            wait_until(
                lambda: (
                    not objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)[
                        "items"
                    ]
                ),
                "the Module to be unloaded and deleted",
                # The joined node's pod holds the finalizer until the pod garbage collector
                # removes it (it looks every 20 s, at nodes gone for 40 s).
                timeout=150,
            )
