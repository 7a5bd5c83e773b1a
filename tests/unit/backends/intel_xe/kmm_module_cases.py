"""ClusterPolicies whose KMM Modules are checked under upstream KMM's own schema.

Shared by the unit test that holds each policy to the fields it is meant to
cover and by tests/integration/test_kmm_schema.py, which sends the same
Modules to an apiserver serving KMM's real CRDs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from kmodkit.backends.intel_xe.nfd_rule import NFD_GROUP
from kmodkit.backends.intel_xe.plan import plan
from kmodkit.backends.intel_xe.settings import DRA_GROUP, MODULE_LOADER_SERVICE_ACCOUNT
from kmodkit.sdk import KMM_API_VERSION, ClusterView, Obj
from kmodkit_dev.repo import ROOT

SAMPLE = ROOT / "docs" / "samples" / "clusterpolicy-ubuntu26.04.yaml"
LOADER_ACCOUNT = "xe-module-loader"
DIGEST = "sha256:4b11801a7c15916ec0a8056cdb4fd64d94c6499f1b3e41847b70d2825c102db3"
NEW_DIGEST = "sha256:" + "5" * 64
TEMPLATED_IMAGE = "registry.example.com/${MOD_NAMESPACE}/$MOD_NAME:v7.1.4.8-$KERNEL_FULL_VERSION"
NO_EXECUTE = {
    "key": "gpu.intel.com/maintenance",
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": 300,
}


def sample_policy() -> dict[str, Any]:
    """The policy docs/samples documents."""
    policy: dict[str, Any] = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    return policy


def minimal_policy() -> dict[str, Any]:
    """Only what a kernelModule requires: one mapping."""
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "xe-minimal"},
        "spec": {
            "resourceRegistration": "dp",
            "kernelModule": {
                "kernelMappings": [
                    {
                        "regexp": "^7[.]0[.]",
                        "containerImage": "registry.example.com/xe:v1-$KERNEL_FULL_VERSION",
                    }
                ]
            },
        },
    }


def every_field_policy() -> dict[str, Any]:
    """Every ClusterPolicy field that reaches the Module, set."""
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "xe-every-field"},
        "spec": {
            "resourceRegistration": "dp",
            "useNFDLabeling": True,
            "nodeSelector": {"gpu.intel.com/exists": "true"},
            "pullSecret": {"name": "xe-registry"},
            "tolerations": [
                NO_EXECUTE,
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
            ],
            "kernelModule": {
                "moduleName": "xe",
                "version": "v7.1.4.8_260728.8",
                "firmwarePath": "/firmware",
                "modulesLoadingOrder": ["xe", "drm_buddy", "drm_gpuvm"],
                "registryTLS": {"insecure": True},
                "kernelMappings": [
                    {
                        "regexp": "^7[.]0[.]0-.*-generic$",
                        "containerImage": TEMPLATED_IMAGE,
                        "registryTLS": {"insecureSkipTLSVerify": True},
                        "inTreeModulesToRemove": ["intel_pmc_core", "intel-vsec"],
                        "build": {
                            "dockerfileConfigMap": {"name": "xe-build-u26.04"},
                            "buildArgs": [
                                {"name": "XE_TAG", "value": "xebr_v7.1.4.8_260728.8"},
                                {"name": "IMAGE_PATH", "value": "${MOD_NAMESPACE}/$MOD_NAME"},
                            ],
                            "secrets": [{"name": "xe-source-token"}],
                        },
                        "sign": {
                            "keySecret": {"name": "xe-signing-key"},
                            "certSecret": {"name": "xe-signing-cert"},
                            "filesToSign": ["/opt/lib/modules/${KERNEL_FULL_VERSION}/updates/*.ko"],
                        },
                    },
                    {
                        "regexp": "^6[.]8[.]",
                        "containerImage": f"registry.example.com/intel/xe-oot-kmd@{DIGEST}",
                    },
                    {
                        "regexp": "^6[.]1[0-9][.]",
                        "containerImage": f"registry.example.com/intel/xe-oot-kmd:v1@{DIGEST}",
                    },
                ],
            },
        },
    }


def signed_policy() -> dict[str, Any]:
    """The minimal policy, its driver signed from an unsigned image (kernelModule.sign)."""
    policy = minimal_policy()
    policy["metadata"]["name"] = "xe-signed"
    policy["spec"]["kernelModule"]["sign"] = {
        "unsignedImage": "registry.example.com/intel/xe-unsigned:$KERNEL_FULL_VERSION",
        "unsignedImageRegistryTLS": {"insecureSkipTLSVerify": True},
        "keySecret": {"name": "xe-signing-key"},
        "certSecret": {"name": "xe-signing-cert"},
        "filesToSign": ["/opt/lib/modules/${KERNEL_FULL_VERSION}/updates/xe.ko"],
    }
    return policy


def updated_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """``policy`` changed in ways applied to the live Module in place (a version bump, not a
    version set or cleared, which recreates it)."""
    changed = copy.deepcopy(policy)
    spec = changed["spec"]
    spec["tolerations"] = [*spec.get("tolerations", []), {"operator": "Exists"}]
    km = spec["kernelModule"]
    km["version"] = "v7.1.4.9_260901.1"
    km["kernelMappings"][1]["containerImage"] = (
        f"registry.example.com/intel/xe-oot-kmd@{NEW_DIGEST}"
    )
    km["kernelMappings"].append({"regexp": "^6[.]6[.]", "containerImage": "reg.local/xe:6.6"})
    return changed


POLICIES: dict[str, Callable[[], dict[str, Any]]] = {
    "sample": sample_policy,
    "minimal": minimal_policy,
    "every-field": every_field_policy,
    "signed": signed_policy,
}


def cluster_view(
    namespace: str, loader_account: str | None, owned: Sequence[Obj] = ()
) -> ClusterView:
    """KMM (and NFD, DRA) served, the operator in ``namespace``, with or without a loader
    service account."""
    settings = {MODULE_LOADER_SERVICE_ACCOUNT: loader_account} if loader_account else {}
    return ClusterView(
        nodes=[],
        api_groups=frozenset({"kmm.sigs.x-k8s.io", NFD_GROUP, DRA_GROUP}),
        operator_namespace=namespace,
        watched={"admin-access-namespaces": [{"metadata": {"name": namespace}}]},
        owned=list(owned),
        settings=settings,
    )


def kmm_module(policy: dict[str, Any], view: ClusterView) -> dict[str, Any]:
    """The one KMM Module the Intel backend plans for ``policy``."""
    result = plan(policy, view)
    modules = [o for o in result.objects if o["kind"] == "Module"]
    assert len(modules) == 1, result.status.get("errors")
    (module,) = modules
    assert module["apiVersion"] == KMM_API_VERSION, module["apiVersion"]
    return dict(module)
