"""An Intel ClusterPolicy with a kernelModule on the real node, end to end: the operator
(``kmodkit run``) turns it into a Module for its built-in engine, whose loader pod pulls
the driver image with the policy's pull secret and loads the test pair into the VM's
kernel, and the operator labels the node ready; only then does the device plugin's
DaemonSet put its pod there. Deleting the policy unloads the driver and takes the plugin
away. The driver image is pushed by the test (``images.DRIVER``, the layout a build
pushes): the in-cluster build on this node is test_module.py's, the same engine's; an
Intel policy's build differs only in its Module, which the unit and integration tiers check.

The device plugin is a stand-in (tests/realnode/images.py, ``GPU_PLUGIN``): Intel's image
cannot be pulled here and would find no Intel GPU in the VM. It runs with the DaemonSet's
real pod spec (its arguments, hostPath mounts, security context) and exits at once,
naming what is missing, unless the driver is loaded and the kubelet's device-plugin
socket and the DRM class are mounted. It proves where and when the plugin runs and what
it is given, not a plugin's registration with the kubelet.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core import labels
from kmodkit_dev import realnode
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.integration.intel_support import CP_GROUP, CP_PLURAL, CP_VERSION, policy_status
from tests.realnode import images
from tests.realnode.test_module import STEP_TIMEOUT, loaded_test_modules, module_gone, node_labels
from tests.realnode.test_node import core

pytestmark = pytest.mark.timeout(2400)
POLICY = "xe-real"
MODULE = f"{POLICY}-gpu"
PLUGIN = "app=intel-gpu-plugin"
PLUGIN_DWELL = 15.0


@pytest.fixture
def operator(
    kubeconfig: str,
    kube_api: Any,
    ns: str,
    engine_settings: dict[str, str],
    image_refs: dict[str, str],
    tmp_path: Path,
) -> Iterator[Operator]:
    install(kube_api)
    with running_operator(
        kubeconfig,
        tmp_path / "operator.log",
        **engine_settings,
        KMODKIT_NAMESPACE=ns,
        KMODKIT_INTEL_DEVICE_PLUGIN_IMAGE=image_refs[images.GPU_PLUGIN],
    ) as op:
        yield op


def cluster_policy(image: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{CP_GROUP}/{CP_VERSION}",
        "kind": "ClusterPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "resourceRegistration": "dp",
            "nodeSelector": {realnode.NODE_LABEL: "true"},
            "pullSecret": {"name": images.PULL_SECRET},
            "kernelModule": {
                "moduleName": "kmodkit_test_dev",
                "modulesLoadingOrder": ["kmodkit_test_dev", "kmodkit_test_dep"],
                "firmwarePath": "/firmware",
                "kernelMappings": [{"regexp": r"^.+-amd64$", "containerImage": image}],
            },
        },
    }


@pytest.fixture
def cleanup(kube_api: Any, operator: Operator) -> Iterator[None]:
    """Deletes the policy if the test did not, while the operator still runs."""
    yield
    if not policy_gone(kube_api):
        client.CustomObjectsApi(kube_api).delete_cluster_custom_object(
            CP_GROUP, CP_VERSION, CP_PLURAL, POLICY
        )


def plugin_pods(kube_api: Any, ns: str) -> list[Any]:
    return list(core(kube_api).list_namespaced_pod(ns, label_selector=PLUGIN).items)


def policy_gone(kube_api: Any) -> bool:
    try:
        client.CustomObjectsApi(kube_api).get_cluster_custom_object(
            CP_GROUP, CP_VERSION, CP_PLURAL, POLICY
        )
    except ApiException as err:
        return err.status == 404
    return False


def test_a_cluster_policy_loads_its_driver_before_the_plugin_starts(
    kube_api: Any,
    ns: str,
    operator: Operator,
    cleanup: None,
    real_node: realnode.RealNode,
    image_refs: dict[str, str],
    kernel: str,
) -> None:
    objects = client.CustomObjectsApi(kube_api)
    driver = image_refs[images.DRIVER].rsplit(":", 1)[0]
    objects.create_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, cluster_policy(f"{driver}:${{KERNEL_FULL_VERSION}}")
    )
    ready = labels.READY.key(ns, MODULE)

    # 1. Load and label; until the label is there no plugin pod is on the node.
    def labelled() -> bool:
        # The pods first: a pod seen before the label was read, with no label then, came
        # before it; read the other way round, a label and pod that both came in between the
        # two reads looked like a pod without its label.
        early = [p.metadata.name for p in plugin_pods(kube_api, ns) if p.spec.node_name]
        has_label = ready in node_labels(kube_api, real_node.name)
        assert has_label or not early, f"device plugin pods before the driver was ready: {early}"
        return has_label

    wait_until(labelled, f"the ready label {ready}", timeout=STEP_TIMEOUT, interval=2)
    (loader,) = [
        p
        for p in core(kube_api)
        .list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=module-loader")
        .items
        if p.spec.node_name
    ]
    assert loader.spec.node_name == real_node.name
    assert loader.spec.init_containers[0].image == f"{driver}:{kernel}"

    # 2. The plugin's pod runs on the real node only, and stays running: the stand-in
    # exits at once, saying why, unless the driver is loaded and its mounts are there.
    def plugin_running() -> list[Any]:
        pods = plugin_pods(kube_api, ns)
        for p in pods:
            for c in p.status.container_statuses or []:
                ended = c.state.terminated or (c.last_state and c.last_state.terminated)
                assert not ended, f"the device plugin ended: {ended.message or ended.reason}"
                waiting = c.state.waiting
                assert not waiting or waiting.reason in ("ContainerCreating", "PodInitializing"), (
                    f"the device plugin cannot start: {waiting.reason}: {waiting.message}"
                )
        return [p for p in pods if p.status.phase == "Running"]

    running = wait_until(
        plugin_running, "the device plugin's pod running", timeout=STEP_TIMEOUT, interval=2
    )
    assert [p.spec.node_name for p in running] == [real_node.name]
    assert running[0].spec.containers[0].image == image_refs[images.GPU_PLUGIN]
    # The stand-in's checks take well under a second; a failed one ends it.
    time.sleep(PLUGIN_DWELL)
    assert plugin_running() and plugin_pods(kube_api, ns)[0].status.container_statuses[0].ready
    status = wait_until(
        lambda: (
            (s := policy_status(kube_api, POLICY)).get("devicePluginStatus") == "1/1"
            and s.get("kmmStatus") == "1/1"
            and s
        ),
        "the policy's status: driver and plugin on one node",
        timeout=STEP_TIMEOUT,
        interval=2,
    )
    assert status["engine"] == "Builtin" and status["errors"] == [], status
    loader = objects.get_namespaced_custom_object("kmodkit.io", "v1alpha1", ns, "modules", MODULE)
    assert loader["spec"]["selector"][realnode.NODE_LABEL] == "true"

    # 3. Deleting the policy unloads the driver, and the plugin and the label go with it.
    objects.delete_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, POLICY)
    wait_until(
        lambda: policy_gone(kube_api) and not plugin_pods(kube_api, ns),
        "the policy and its device plugin gone",
        timeout=STEP_TIMEOUT,
        interval=2,
    )
    # The Module's finalizer goes once the driver is unloaded, the label with it.
    wait_until(
        lambda: module_gone(kube_api, ns, MODULE), "the driver's Module gone", timeout=STEP_TIMEOUT
    )
    assert ready not in node_labels(kube_api, real_node.name)
    assert loaded_test_modules(kube_api, ns, image_refs[images.BUSYBOX]) == "0"
