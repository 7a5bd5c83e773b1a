"""The example out-of-tree backend (tests/plugins/kmodkit-example): its declaration and plan."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

from kmodkit.core.contract.backend import ClusterView, PlanFn
from kmodkit.core.runtime.plugins import check
from kmodkit.core.schema.crd import crd_manifest
from tests.plugins.install import PLUGINS

NS = "kmodkit-system"
DRIVER: dict[str, Any] = {
    "apiVersion": "acme.example.com/v1alpha1",
    "kind": "AcmeDriver",
    "metadata": {"name": "npu", "uid": "u-1", "generation": 1},
    "spec": {
        "image": "registry.example.com/acme/npu:${KERNEL_FULL_VERSION}",
        "nodeSelector": {"acme.example.com/npu": "present"},
        "imagePullSecret": "pull",
    },
}


@pytest.fixture(scope="module")
def example() -> ModuleType:
    # Imported from its source: installing it is the integration test's part.
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(PLUGINS / "kmodkit-example"))
        return importlib.import_module("kmodkit_example")


@pytest.fixture(scope="module")
def plan(example: ModuleType) -> PlanFn:
    (resource,) = example.backend.resources
    return resource.plan


def _view(**kwargs: Any) -> ClusterView:
    return ClusterView(
        nodes=(), api_groups=frozenset(), operator_namespace=NS, watched={}, **kwargs
    )


def test_the_backend_meets_the_contract(example: ModuleType) -> None:
    assert check("example", example.backend) is example.backend
    (resource,) = example.backend.resources
    crd = crd_manifest(resource.crd)
    assert crd["metadata"]["name"] == "acmedrivers.acme.example.com"
    assert crd["spec"]["scope"] == "Cluster"


def test_plan_is_a_module_and_a_device_plugin_gated_on_its_readiness(plan: PlanFn) -> None:
    settings = {"KMODKIT_ACME_DEVICE_PLUGIN_IMAGE": "registry.invalid/dp:2"}
    module, daemonset = plan(DRIVER, _view(settings=settings)).objects
    assert module["metadata"] == {"name": "acme-npu", "namespace": NS}
    assert module["spec"] == {
        "selector": {"acme.example.com/npu": "present"},
        "imageRepoSecret": {"name": "pull"},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "acme_npu"},
                "kernelMappings": [
                    {
                        "regexp": "^.+$",
                        "containerImage": "registry.example.com/acme/npu:${KERNEL_FULL_VERSION}",
                    }
                ],
            }
        },
    }
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "acme.example.com/npu": "present",
        f"kmm.node.kubernetes.io/{NS}.acme-npu.ready": "",
    }
    assert pod["containers"][0]["image"] == "registry.invalid/dp:2"


def test_status_counts_what_the_owned_objects_report(plan: PlanFn) -> None:
    owned = (
        {"kind": "Module", "status": {"moduleLoader": {"availableNumber": 3}}},
        {"kind": "DaemonSet", "status": {"numberReady": 2}},
    )
    assert plan(DRIVER, _view(owned=owned)).status == {
        "module": f"{NS}/acme-npu",
        "readyNodes": 3,
        "devicePluginPods": 2,
    }
    assert plan(DRIVER, _view()).status["readyNodes"] == 0


def test_offline_validation_names_the_field(example: ModuleType) -> None:
    (resource,) = example.backend.resources
    assert resource.validate(DRIVER) == []
    bad = {**DRIVER, "spec": {"image": "x", "nodeSelektor": {}}}
    assert [(p.path, p.message) for p in resource.validate(bad)] == [
        ("spec.nodeSelektor", "is not a known field; check its spelling and indentation")
    ]
