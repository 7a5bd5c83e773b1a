"""Without upstream KMM, a ClusterPolicy's driver is loaded by kmodkit's built-in engine.

A real operator, a real registry holding the driver image, and kwok nodes
running Ubuntu 26.04's kernel: the policy's Module goes to the built-in
engine, which loads the driver; the device plugin follows the readiness
labels, and ``kubectl get clusterpolicy`` shows both.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit_dev import cluster as devcluster
from kmodkit_dev import kmm_crds
from kmodkit_dev import manifests as devmanifests
from kmodkit_dev.operator import Operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration import intel_support
from tests.integration.crds_util import install
from tests.integration.intel_support import CP_GROUP, CP_PLURAL, CP_VERSION

KERNEL = "7.0.0-14-generic"
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
    devmanifests.uninstall_crds(kube_api, [{"metadata": {"name": KMM_CRD}}])


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any, oci_registry: Registry) -> Iterator[str]:
    yield from intel_support.operator_namespace(kube_api, "ib", oci_registry)


@pytest.fixture(scope="module")
def operator(
    without_kmm: None,
    kubeconfig: str,
    operator_namespace: str,
    oci_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    log = tmp_path_factory.mktemp("intel-builtin") / "operator.log"
    with intel_support.intel_operator(kubeconfig, log, operator_namespace, oci_registry) as op:
        yield op


@pytest.fixture(scope="module")
def gpu_nodes(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"ib-{tag}-{i}" for i in range(2)]
    for made in intel_support.gpu_nodes(dev_cluster, names, [KERNEL, KERNEL], tag):
        yield tag, made


_status = intel_support.policy_status


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
    image = f"{oci_registry.host}/kmods/xe:$KERNEL_FULL_VERSION"
    policy = intel_support.policy(name, tag, image, firmwarePath="/firmware")
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


def _modules(kube_api: Any, namespace: str, group: str, version: str) -> dict[str, Any]:
    try:
        items = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
            group, version, namespace, "modules"
        )["items"]
    except ApiException as err:
        if err.status == 404:  # the group is not served
            return {}
        raise
    return {m["metadata"]["name"]: m for m in items}


def test_kmm_installed_live_takes_over_only_once_it_serves_and_nothing_unloads(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    """KMM's CRDs installed while the operator runs (engine Auto): the policy gets a KMM
    Module next to the built-in one, which keeps serving while KMM has not loaded the
    driver everywhere, so CRDs without KMM's controller cost nothing. This test then
    plays KMM's controller (a stand-in: it writes the KMM Module's status as KMM would
    once its workers have loaded every node); the built-in Module is handed over and
    goes without one unloader pod and with the readiness labels in place. Removing
    KMM's CRDs moves the policy back to the built-in engine."""
    tag, nodes = gpu_nodes
    name = f"sw{tag}"
    module = f"{name}-gpu"
    ready = f"kmm.node.kubernetes.io/{operator_namespace}.{module}.ready"
    _push(oci_registry, f"{oci_registry.host}/kmods/xe:{KERNEL}", tmp_path)
    objects = client.CustomObjectsApi(kube_api)
    core = client.CoreV1Api(kube_api)
    policy = intel_support.policy(name, tag, f"{oci_registry.host}/kmods/xe:$KERNEL_FULL_VERSION")

    def labelled() -> bool:
        return all(ready in (core.read_node(n).metadata.labels or {}) for n in nodes)

    def unloaders() -> list[str]:
        pods = core.list_namespaced_pod(
            operator_namespace, label_selector="app.kubernetes.io/component=module-unloader"
        ).items
        return [p.metadata.name for p in pods if p.metadata.name.startswith(module)]

    objects.create_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, policy)
    crds: list[dict[str, Any]] = []
    try:
        wait_until(lambda: _status(kube_api, name).get("kmmStatus") == "2/2", "loaded", timeout=90)
        crds = kmm_crds.install(kube_api)
        wait_until(
            lambda: (
                module in _modules(kube_api, operator_namespace, "kmm.sigs.x-k8s.io", "v1beta1")
            ),
            "a KMM Module next to the built-in one",
        )
        status = wait_until(
            lambda: (s := _status(kube_api, name)).get("engineSwitch") and s, "the switch phase"
        )
        assert status["engineSwitch"].startswith(
            "Builtin to KMM: waiting for KMM to load the driver on every node"
        )
        assert status["engine"] == "Builtin"
        time.sleep(5)  # KMM's CRDs, no KMM controller: the built-in engine keeps serving
        assert module in _modules(kube_api, operator_namespace, "kmodkit.io", "v1alpha1")
        assert labelled() and unloaders() == []

        loaded = {"nodesMatchingSelectorNumber": 2, "desiredNumber": 2, "availableNumber": 2}
        objects.patch_namespaced_custom_object_status(
            "kmm.sigs.x-k8s.io",
            "v1beta1",
            operator_namespace,
            "modules",
            module,
            {"status": {"moduleLoader": loaded}},
        )
        # Once timed out at 60 s in a full run on a loaded machine (not seen alone): a
        # finalizer retried after a transient error waits out kopf's 60 s back-off.
        wait_until(
            lambda: module not in _modules(kube_api, operator_namespace, "kmodkit.io", "v1alpha1"),
            "the built-in Module handed over and gone",
            timeout=150,
        )
        status = wait_until(
            lambda: (s := _status(kube_api, name)).get("engineSwitch") == "" and s,
            "the switch done",
        )
        assert status["engine"] == "KMM" and status["kmmStatus"] == "2/2"
        assert labelled() and unloaders() == []

        kmm_crds.uninstall(kube_api, crds)
        crds = []
        wait_until(
            lambda: module in _modules(kube_api, operator_namespace, "kmodkit.io", "v1alpha1"),
            "back to the built-in engine",
            timeout=60,
        )
        wait_until(
            lambda: (
                (s := _status(kube_api, name)).get("engine") == "Builtin"
                and s.get("kmmStatus") == "2/2"
            ),
            "the built-in engine serving again",
            timeout=90,
        )
        assert labelled()
    finally:
        if crds:
            kmm_crds.uninstall(kube_api, crds)
        objects.delete_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, name)
