"""The Intel backend against upstream KMM's real Module CRD on a real control plane.

KMM's CRDs come from its Go module through the Go module proxy, at the
commit Intel's operator pins, cached under ~/.cache/kmodkit; nothing of KMM
is committed here. No KMM controller runs: these tests check what the
operator asks of KMM (Modules KMM's schema accepts, their lifecycle, the
claim guard, readiness gating), not KMM itself.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backends.intel_xe.plan import plan
from core.backend import ClusterView
from devcluster import cluster as devcluster
from devcluster.nodes import node_manifest
from tests.integration.crds_util import apply, install, wait_established
from tests.integration.operator_process import Operator, running_operator
from tests.waiting import wait_until

KMM_MODULE = "sigs.k8s.io/kernel-module-management"
# Commit de3f8c9 (2026-07-29), the one Intel's gpu-base-operator pins.
KMM_VERSION = "v1.0.1-0.20260729111759-de3f8c9d5eae"
KMM_GROUP, KMM_VERSION_API, MODULES = "kmm.sigs.x-k8s.io", "v1beta1", "modules"
CP_GROUP, CP_VERSION, CP_PLURAL = "intel.com", "v1alpha1", "clusterpolicies"
SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "samples" / "clusterpolicy-ubuntu26.04.yaml"

pytestmark = pytest.mark.cluster


def kmm_module_crd() -> dict[str, Any]:
    """KMM's Module CRD, fetched once through the Go module proxy and cached."""
    cache = Path.home() / ".cache" / "kmodkit" / "kmm-crds" / KMM_VERSION
    crd = cache / "kmm.sigs.x-k8s.io_modules.yaml"
    if not crd.exists():
        go = shutil.which("go")
        assert go, "the Go toolchain is needed to fetch KMM's CRDs from the Go module proxy"
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{KMM_MODULE}@{KMM_VERSION}"],
            capture_output=True,
            text=True,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
            timeout=300,
        )
        info = json.loads(done.stdout or "{}")
        if "Dir" not in info:
            pytest.fail(
                f"cannot fetch {KMM_MODULE}@{KMM_VERSION} through the Go module proxy: "
                f"{info.get('Error') or done.stderr.strip()}; put KMM's config/crd/bases/*.yaml "
                f"of that commit into {cache} to run these tests offline"
            )
        cache.mkdir(parents=True, exist_ok=True)
        for path in (Path(info["Dir"]) / "config" / "crd" / "bases").glob("*.yaml"):
            shutil.copyfile(path, cache / path.name)
    return dict(yaml.safe_load(crd.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def kmm(kube_api: Any) -> None:
    install(kube_api)
    crd = kmm_module_crd()
    apply(kube_api, crd)
    wait_established(kube_api, crd["metadata"]["name"])


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any) -> Iterator[str]:
    name = f"ix-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "kmodkit.io/operator-namespace": "true",
                    "resource.kubernetes.io/admin-access": "true",
                },
            }
        }
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def operator(
    kmm: None,
    kubeconfig: str,
    operator_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    log = tmp_path_factory.mktemp("intel-kmm") / "operator.log"
    with running_operator(kubeconfig, log, KMODKIT_NAMESPACE=operator_namespace) as op:
        yield op


@pytest.fixture(scope="module")
def gpu_nodes(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"ix-{tag}-{i}" for i in range(2)]
    devcluster.add_nodes(
        dev_cluster, [node_manifest(n, "7.0.0-14-generic", {"intel-test": tag}) for n in names]
    )
    yield tag, names
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for n in names:
        core.delete_node(n)


def _policy(name: str, tag: str, **kernel_module: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{CP_GROUP}/{CP_VERSION}",
        "kind": "ClusterPolicy",
        "metadata": {"name": name},
        "spec": {
            "resourceRegistration": "dp",
            "nodeSelector": {"intel-test": tag},
            "kernelModule": {
                "kernelMappings": [
                    {
                        "regexp": "^7[.]0[.]0-.*-generic$",
                        "containerImage": "registry.example.com/xe:v1-$KERNEL_FULL_VERSION",
                    }
                ],
                **kernel_module,
            },
        },
    }


def _modules(kube_api: Any, namespace: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
        KMM_GROUP, KMM_VERSION_API, namespace, MODULES
    )["items"]
    return {m["metadata"]["name"]: m for m in items}


def _status(kube_api: Any, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube_api).get_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, name
    )
    return dict(obj.get("status") or {})


def _patch_spec(kube_api: Any, name: str, patch: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube_api).patch_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, name, {"spec": patch}
    )


def test_every_module_the_backend_emits_is_valid_for_kmm(kmm: None, kube_api: Any) -> None:
    sample = yaml.safe_load(SAMPLE.read_text())
    full = copy.deepcopy(sample)
    full["spec"].update(
        useNFDLabeling=True,
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    km = full["spec"]["kernelModule"]
    km.update(version="v7.1.4.8", registryTLS={"insecure": True})
    km["kernelMappings"][0].update(
        registryTLS={"insecureSkipTLSVerify": True},
        build={**km["kernelMappings"][0]["build"], "secrets": [{"name": "src"}]},
    )
    km["kernelMappings"].append({"regexp": "^6[.]8", "containerImage": "reg.local/xe:6.8"})
    view = ClusterView(
        nodes=[],
        api_groups=frozenset({KMM_GROUP}),
        operator_namespace="default",
        watched={},
        settings={"KMODKIT_INTEL_MODULE_LOADER_SERVICE_ACCOUNT": "module-loader"},
    )
    objects = client.CustomObjectsApi(kube_api)
    for policy in (sample, full):
        (module,) = [o for o in plan(policy, view).objects if o["kind"] == "Module"]
        assert module["apiVersion"] == f"{KMM_GROUP}/{KMM_VERSION_API}"
        # Strict: a field KMM's schema does not know is an error, not silently pruned.
        created = objects.create_namespaced_custom_object(
            KMM_GROUP,
            KMM_VERSION_API,
            "default",
            MODULES,
            module,
            dry_run="All",
            field_validation="Strict",
        )
        # Every field sent came back: nothing was pruned (KMM may add defaults).
        assert _kept(module["spec"], created["spec"]), created["spec"]


def test_module_lifecycle_claim_guard_and_gating(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    tag, nodes = gpu_nodes
    name = f"xe{tag}"
    module_name = f"{name}-gpu"
    objects = client.CustomObjectsApi(kube_api)
    objects.create_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, _policy(name, tag))
    try:
        module = wait_until(
            lambda: _modules(kube_api, operator_namespace).get(module_name), "the KMM Module"
        )
        (owner,) = module["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("ClusterPolicy", name, True)
        status = wait_until(
            lambda: (s := _status(kube_api, name)).get("kmmStatus") == "0/0" and s, "KMM status"
        )
        assert status["engine"] == "KMM"

        # The device plugin starts only where the driver's readiness label is.
        ready = f"kmm.node.kubernetes.io/{operator_namespace}.{module_name}.ready"
        core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
        core.patch_node(nodes[0], {"metadata": {"labels": {ready: ""}}})
        wait_until(
            lambda: _status(kube_api, name).get("devicePluginStatus") == "1/1",
            "the device plugin on the one ready node",
        )
        pods = core.list_namespaced_pod(operator_namespace, label_selector="app=intel-gpu-plugin")
        assert [p.spec.node_name for p in pods.items] == [nodes[0]]
        ds = apps.read_namespaced_daemon_set(f"{name}-device-plugin", operator_namespace)
        assert ds.spec.template.spec.node_selector[ready] == ""

        # Switching version between empty and set recreates the Module ...
        uid = module["metadata"]["uid"]
        _patch_spec(kube_api, name, {"kernelModule": {"version": "v1"}})
        recreated = wait_until(
            lambda: (
                (m := _modules(kube_api, operator_namespace).get(module_name))
                and m["metadata"]["uid"] != uid
                and m
            ),
            "the Module recreated with a version",
        )
        assert recreated["spec"]["moduleLoader"]["container"]["version"] == "v1"
        # ... while a bump with both set patches it in place.
        _patch_spec(kube_api, name, {"kernelModule": {"version": "v2"}})
        bumped = wait_until(
            lambda: (
                (m := _modules(kube_api, operator_namespace)[module_name])["spec"]["moduleLoader"][
                    "container"
                ].get("version")
                == "v2"
                and m
            ),
            "the version bump",
        )
        assert bumped["metadata"]["uid"] == recreated["metadata"]["uid"]

        # An allocated GPU claim holds the Module when kernelModule is removed.
        claim = _allocated_claim(kube_api, operator_namespace, tag)
        _patch_spec(kube_api, name, {"kernelModule": None})
        blocked = wait_until(
            lambda: (e := _status(kube_api, name).get("errors")) and "blocking" in e[0] and e,
            "the claim guard's message",
        )
        assert f"modules.{KMM_GROUP}/{module_name} deletion" in blocked[0]
        assert f"{operator_namespace}/{claim}" in blocked[0]
        assert module_name in _modules(kube_api, operator_namespace)
        # Without a readiness gate the device plugin runs on both nodes again.
        wait_until(
            lambda: _status(kube_api, name).get("devicePluginStatus") == "2/2",
            "the ungated device plugin",
        )
        client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
            "resource.k8s.io",
            "v1",
            operator_namespace,
            "resourceclaims",
            claim,
            {"status": {"allocation": None}},
        )
        wait_until(
            lambda: module_name not in _modules(kube_api, operator_namespace),
            "the Module to be removed once the claim is released",
        )
        wait_until(lambda: _status(kube_api, name).get("kmmStatus") == "N/A", "kmmStatus N/A")
    finally:
        _delete_policy(kube_api, name)
        _delete_device_class(kube_api, f"intel-test-{tag}")


def test_deleting_the_policy_collects_its_module(
    operator: Operator, kube_api: Any, operator_namespace: str, gpu_nodes: tuple[str, list[str]]
) -> None:
    tag, _ = gpu_nodes
    name = f"gc{tag}"
    client.CustomObjectsApi(kube_api).create_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, _policy(name, tag)
    )
    wait_until(lambda: f"{name}-gpu" in _modules(kube_api, operator_namespace), "the Module")
    _delete_policy(kube_api, name)
    wait_until(
        lambda: f"{name}-gpu" not in _modules(kube_api, operator_namespace),
        "garbage collection of the Module",
        timeout=90,
    )


def _kept(sent: Any, stored: Any) -> bool:
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            k in stored and _kept(v, stored[k]) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return (
            isinstance(stored, list)
            and len(sent) == len(stored)
            and all(_kept(a, b) for a, b in zip(sent, stored, strict=True))
        )
    return bool(sent == stored)


def _delete_policy(kube_api: Any, name: str) -> None:
    try:
        client.CustomObjectsApi(kube_api).delete_cluster_custom_object(
            CP_GROUP, CP_VERSION, CP_PLURAL, name
        )
    except ApiException as err:
        if err.status != 404:
            raise


def _delete_device_class(kube_api: Any, name: str) -> None:
    try:
        client.CustomObjectsApi(kube_api).delete_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", name
        )
    except ApiException as err:
        if err.status != 404:
            raise


def _allocated_claim(kube_api: Any, namespace: str, tag: str) -> str:
    """A claim with a device allocated from Intel's driver, written as the scheduler would."""
    objects = client.CustomObjectsApi(kube_api)
    device_class = f"intel-test-{tag}"
    objects.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        {"metadata": {"name": device_class}, "spec": {}},
    )
    name = "inference"
    objects.create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            },
        },
    )
    objects.patch_namespaced_custom_object_status(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        name,
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": "gpu.intel.com",
                                "pool": "node-0",
                                "device": "gpu-0",
                            }
                        ]
                    }
                }
            }
        },
    )
    return name
