"""Module bodies the unit and integration tests share."""

from __future__ import annotations

import copy
from typing import Any

# A full KMM-style Module, close to upstream's documented examples: several
# mappings, builds at both levels, TLS settings, in-tree removal, ordered
# loading, tolerations and a version.
KMM_EXAMPLE: dict[str, Any] = {
    "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
    "kind": "Module",
    "metadata": {"name": "xe", "namespace": "drivers"},
    "spec": {
        "selector": {"feature.node.kubernetes.io/pci-0300_8086.present": "true"},
        "tolerations": [
            {"key": "gpu", "operator": "Equal", "value": "intel", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "imageRepoSecret": {"name": "registry-push"},
        "moduleLoader": {
            "serviceAccountName": "xe-loader",
            "container": {
                "modprobe": {
                    "moduleName": "xe",
                    "dirName": "/opt",
                    "firmwarePath": "/firmware",
                    "parameters": ["enable_guc=3"],
                    "args": {"load": ["--first-time"], "unload": ["--wait=5000"]},
                    "modulesLoadingOrder": ["xe", "intel_vsec", "drm_gpuvm"],
                },
                "containerImage": "registry.example.com:5000/drivers/xe:${KERNEL_FULL_VERSION}",
                "imagePullPolicy": "IfNotPresent",
                "version": "1.4.0",
                "registryTLS": {"insecure": False, "insecureSkipTLSVerify": True},
                "inTreeModulesToRemove": ["xe", "i915"],
                "build": {
                    "dockerfileConfigMap": {"name": "xe-dockerfile"},
                    "buildArgs": [
                        {"name": "XE_REF", "value": "v1.4.0"},
                        {"name": "KVER_SHORT", "value": "${KERNEL_XYZ}"},
                    ],
                    "secrets": [{"name": "git-token"}],
                    "baseImageRegistryTLS": {"insecure": True},
                    "selector": {"node-role.kubernetes.io/builder": ""},
                },
                "kernelMappings": [
                    {"literal": "6.8.0-45-generic", "containerImage": ""},
                    {
                        "regexp": r"^6\.1[0-9]\..*\.el9_[0-9]+\.x86_64$",
                        "containerImage": "registry.example.com/drivers/xe-el9:$KERNEL_X.$KERNEL_Y",
                        "registryTLS": {"insecure": True},
                        "inTreeModulesToRemove": ["i915"],
                        "build": {
                            "dockerfileConfigMap": {"name": "xe-dockerfile-el9"},
                            "buildArgs": [
                                {"name": "XE_REF", "value": "v1.4.0-el9"},
                                {"name": "DISTRO", "value": "el9"},
                            ],
                            "secrets": [{"name": "rhsm"}],
                        },
                    },
                    {"regexp": "^6\\.", "containerImage": ""},
                ],
            },
        },
    },
}


def kmm_example() -> dict[str, Any]:
    """A fresh copy of the full example, safe to modify."""
    return copy.deepcopy(KMM_EXAMPLE)


def kmodkit_example() -> dict[str, Any]:
    """The full example as a kmodkit Module, with a rollout policy."""
    body = kmm_example()
    body["apiVersion"] = "kmodkit.io/v1alpha1"
    body["spec"]["rollout"] = {"maxUnavailable": "25%"}
    return body


def minimal(**container: Any) -> dict[str, Any]:
    """The smallest valid kmodkit Module; ``container`` fields override its container."""
    body: dict[str, Any] = {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": "mod", "namespace": "ns"},
        "spec": {
            "selector": {},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "mod"},
                    "kernelMappings": [
                        {
                            "regexp": "^.+$",
                            "containerImage": "quay.io/org/mod:${KERNEL_FULL_VERSION}",
                        }
                    ],
                }
            },
        },
    }
    body["spec"]["moduleLoader"]["container"].update(container)
    return body


def image_from_the_container() -> dict[str, Any]:
    """KMM's shape: a mapping with no containerImage takes the container's."""
    return minimal(
        containerImage="quay.io/org/mod:${KERNEL_FULL_VERSION}",
        kernelMappings=[{"regexp": "^.+$"}],
    )
