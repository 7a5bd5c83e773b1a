"""Without upstream KMM, a ClusterPolicy's driver is loaded by kmodkit's built-in engine.

A real operator, a real registry holding the driver image, and kwok nodes
running Ubuntu 26.04's kernel: the policy's Module goes to the built-in
engine, which loads the driver; the device plugin follows the readiness
labels, and ``kubectl get clusterpolicy`` shows both.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install

KERNEL = "7.0.0-14-generic"
CP_GROUP, CP_VERSION, CP_PLURAL = "intel.com", "v1alpha1", "clusterpolicies"
KMM_CRD = "modules.kmm.sigs.x-k8s.io"

pytestmark = pytest.mark.cluster


def _push(reg: Registry, reference: str, tmp: Path) -> None:
    """Push a small artifact as the driver image (the loader is simulated on kwok nodes)."""
    import oras.client

    payload = tmp / "xe.ko.txt"
    payload.write_text(reference)
    # The test registry (htpasswd) challenges with Basic, not a token realm.
    pusher = oras.client.OrasClient(hostname=reg.host, tls_verify=str(reg.ca), auth_backend="basic")
    pusher.login(
        username=reg.username, password=reg.password, hostname=reg.host, tls_verify=str(reg.ca)
    )
    pusher.push(target=reference, files=[str(payload)], disable_path_validation=True)


@pytest.fixture(scope="module")
def without_kmm(kube_api: Any) -> None:
    install(kube_api)
    extensions = client.ApiextensionsV1Api(kube_api)
    try:
        extensions.delete_custom_resource_definition(KMM_CRD)
    except ApiException as err:
        if err.status != 404:
            raise

    def gone() -> bool:
        try:
            extensions.read_custom_resource_definition(KMM_CRD)
        except ApiException as err:
            return err.status == 404
        return False

    wait_until(gone, "KMM's CRD to be absent")


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any, oci_registry: Registry) -> Iterator[str]:
    name = f"ib-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_secret(name, oci_registry.pull_secret("pull"))
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def operator(
    without_kmm: None,
    kubeconfig: str,
    operator_namespace: str,
    oci_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    log = tmp_path_factory.mktemp("intel-builtin") / "operator.log"
    with running_operator(
        kubeconfig,
        log,
        KMODKIT_NAMESPACE=operator_namespace,
        KMODKIT_REGISTRY_CA=str(oci_registry.ca),
        KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:test",
    ) as op:
        yield op


@pytest.fixture(scope="module")
def gpu_nodes(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"ib-{tag}-{i}" for i in range(2)]
    devcluster.add_nodes(
        dev_cluster, [node_manifest(n, KERNEL, {"intel-test": tag}) for n in names]
    )
    yield tag, names
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for n in names:
        core.delete_node(n)


def _status(kube_api: Any, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube_api).get_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, name
    )
    return dict(obj.get("status") or {})


def test_builtin_engine_loads_the_driver_and_columns_show_it(
    operator: Operator,
    kube_api: Any,
    kubeconfig: str,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    tag, nodes = gpu_nodes
    name = f"xe{tag}"
    _push(oci_registry, f"{oci_registry.host}/kmods/xe:{KERNEL}", tmp_path)
    policy = {
        "apiVersion": f"{CP_GROUP}/{CP_VERSION}",
        "kind": "ClusterPolicy",
        "metadata": {"name": name},
        "spec": {
            "resourceRegistration": "dp",
            "nodeSelector": {"intel-test": tag},
            "pullSecret": {"name": "pull"},
            "kernelModule": {
                "firmwarePath": "/firmware",
                "kernelMappings": [
                    {
                        "regexp": "^7[.]0[.]0-.*-generic$",
                        "containerImage": f"{oci_registry.host}/kmods/xe:$KERNEL_FULL_VERSION",
                    }
                ],
            },
        },
    }
    objects = client.CustomObjectsApi(kube_api)
    objects.create_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, policy)
    try:
        status = wait_until(
            lambda: (
                (s := _status(kube_api, name)).get("kmmStatus") == "2/2"
                and s.get("devicePluginStatus") == "2/2"
                and s
            ),
            "the driver loaded and the device plugin running on both nodes",
            timeout=90,
        )
        assert status["engine"] == "Builtin"
        assert status["errors"] == []
        module = objects.get_namespaced_custom_object(
            "kmodkit.io", "v1alpha1", operator_namespace, "modules", f"{name}-gpu"
        )
        assert module["spec"]["moduleLoader"]["container"]["modprobe"]["firmwarePath"] == (
            "/firmware"
        )
        ready = f"kmm.node.kubernetes.io/{operator_namespace}.{name}-gpu.ready"
        core = client.CoreV1Api(kube_api)
        for node in nodes:
            assert ready in (core.read_node(node).metadata.labels or {})
        shown = subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "get", "clusterpolicy", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert shown[0].split() == ["NAME", "DP", "DRA", "XPU", "KMM", "AGE"]
        assert shown[1].split()[:5] == [name, "2/2", "N/A", "N/A", "2/2"]
    finally:
        objects.delete_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, name)
