"""useNFDLabeling with node-feature-discovery's real master.

nfd-master (built from the Go module proxy) runs against the control plane with
NFD's own CRDs. The ClusterPolicy's NodeFeatureRule is applied by the operator,
and nfd-master's labels decide where the driver and the device plugin go. kwok
nodes have no PCI bus or kernel for nfd-worker to read, so this test writes each
node's NodeFeature as nfd-worker would (a stand-in for the worker, not for the
master): one node with an Intel Arc B580, one with another vendor's display
controller; later the first reports the xe module loaded.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import cluster as devcluster
from kmodkit_dev import manifests as devmanifests
from kmodkit_dev import nfd
from kmodkit_dev.operator import Operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration import intel_support
from tests.integration.crds_util import install
from tests.integration.intel_support import CP_GROUP, CP_PLURAL, CP_VERSION, policy_status

KERNEL = "7.0.0-14-generic"
GPU_PCI = "intel.feature.node.kubernetes.io/gpu-pci"
GPU = "intel.feature.node.kubernetes.io/gpu"
B580 = {"vendor": "8086", "class": "0300", "device": "e20b"}
OTHER = {"vendor": "10de", "class": "0300", "device": "2684"}

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def nfd_master(
    kube_api: Any, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    crds = nfd.crds()
    devmanifests.install(kube_api, crds)
    log = tmp_path_factory.mktemp("nfd") / "nfd-master.log"
    host = client.CoreV1Api(kube_api).list_node(limit=1).items[0].metadata.name
    try:
        with nfd.running_master(kubeconfig, log, host, extra_label_namespaces=["gpu.intel.com"]):
            yield
    finally:
        devmanifests.uninstall_crds(kube_api, crds)


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any, oci_registry: Registry) -> Iterator[str]:
    yield from intel_support.operator_namespace(kube_api, "nfd", oci_registry)


@pytest.fixture(scope="module")
def operator(
    nfd_master: None,
    kube_api: Any,
    kubeconfig: str,
    operator_namespace: str,
    oci_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    install(kube_api)
    log = tmp_path_factory.mktemp("intel-nfd") / "operator.log"
    with intel_support.intel_operator(
        kubeconfig,
        log,
        operator_namespace,
        oci_registry,
        KMODKIT_INTEL_ENGINE="builtin",
        KMODKIT_IMAGE_RECHECK_SECONDS="3",
    ) as op:
        yield op


@pytest.fixture(scope="module")
def gpu_nodes(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"nfd-{tag}-{kind}" for kind in ("arc", "other")]
    for made in intel_support.gpu_nodes(dev_cluster, names, [KERNEL, KERNEL], tag):
        yield tag, made


def _labels(kube_api: Any, node: str) -> dict[str, str]:
    return dict(client.CoreV1Api(kube_api).read_node(node).metadata.labels or {})


def _loader_nodes(kube_api: Any, namespace: str) -> list[str]:
    pods = client.CoreV1Api(kube_api).list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/component=module-loader"
    )
    return sorted(p.spec.node_name for p in pods.items)


def _report(kube_api: Any, namespace: str, feature: dict[str, Any]) -> None:
    """Write (or rewrite) a node's NodeFeature, as its nfd-worker would."""
    objects = client.CustomObjectsApi(kube_api)
    name = feature["metadata"]["name"]
    try:
        objects.delete_namespaced_custom_object(
            "nfd.k8s-sigs.io", "v1alpha1", namespace, "nodefeatures", name
        )
    except client.ApiException as err:
        if err.status != 404:
            raise
    objects.create_namespaced_custom_object(
        "nfd.k8s-sigs.io", "v1alpha1", namespace, "nodefeatures", feature
    )


def test_nfd_labels_place_the_driver_and_then_the_device_plugin(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    tag, (arc, other) = gpu_nodes
    name = f"nfd{tag}"
    oci_registry.push(f"{oci_registry.host}/kmods/xe-{name}:{KERNEL}")
    _report(kube_api, operator_namespace, nfd.node_feature(arc, operator_namespace, [B580]))
    _report(kube_api, operator_namespace, nfd.node_feature(other, operator_namespace, [OTHER]))
    image = f"{oci_registry.host}/kmods/xe-{name}:$KERNEL_FULL_VERSION"
    policy = intel_support.policy(name, tag, image, spec={"useNFDLabeling": True})
    objects = client.CustomObjectsApi(kube_api)
    objects.create_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, policy)
    try:
        # The operator's NodeFeatureRule, evaluated by nfd-master: the Arc node only.
        labels = wait_until(
            lambda: (ls := _labels(kube_api, arc)).get(GPU_PCI) == "true" and ls,
            "nfd-master to label the Intel GPU node",
            timeout=90,
        )
        assert labels["gpu.intel.com/product"] == "Arc_B580"
        assert labels["gpu.intel.com/architecture"] == "Xe2"
        assert GPU_PCI not in _labels(kube_api, other)
        # The driver goes where the device is; the device plugin waits for NFD to
        # see a working driver (gpu=true), which needs the module loaded.
        wait_until(
            lambda: policy_status(kube_api, name).get("kmmStatus") == "1/1",
            "the driver",
            timeout=90,
        )
        assert _loader_nodes(kube_api, operator_namespace) == [arc]
        assert GPU not in _labels(kube_api, arc)
        assert policy_status(kube_api, name)["devicePluginStatus"] == "0/0"

        _report(
            kube_api,
            operator_namespace,
            nfd.node_feature(arc, operator_namespace, [B580], loaded_modules=["xe"]),
        )
        wait_until(lambda: _labels(kube_api, arc).get(GPU) == "true", "gpu=true", timeout=90)
        wait_until(
            lambda: policy_status(kube_api, name).get("devicePluginStatus") == "1/1",
            "the device plugin on the node with a working driver",
            timeout=90,
        )
        assert GPU not in _labels(kube_api, other)
    finally:
        objects.delete_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, name)
