"""The fake fleet: kwok Node objects with realistic labels and kernels.

Pure functions: they return Node manifests; the cluster module creates them.
"""

from __future__ import annotations

from typing import Any

# Kernels a real accelerator fleet runs side by side: Ubuntu 26.04's, Ubuntu
# 24.04's HWE-less kernel and RHEL 9's.
KERNELS = ("7.0.0-14-generic", "6.8.0-45-generic", "5.14.0-427.el9.x86_64")
OS_IMAGES = {
    "7.0.0-14-generic": "Ubuntu 26.04 LTS",
    "6.8.0-45-generic": "Ubuntu 24.04.1 LTS",
    "5.14.0-427.el9.x86_64": "Red Hat Enterprise Linux 9.4 (Plow)",
}

# NFD-style labels a node with the accelerator would carry.
INTEL_GPU_LABELS = {
    "feature.node.kubernetes.io/pci-0380_8086.present": "true",
    "intel.feature.node.kubernetes.io/gpu-pci": "true",
}
TENSTORRENT_LABELS = {"feature.node.kubernetes.io/pci-1200_1e52.present": "true"}

PROFILES = ("mixed", "intel", "tenstorrent", "plain")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def accelerator_labels(profile: str, index: int) -> dict[str, str]:
    if profile == "intel":
        return dict(INTEL_GPU_LABELS)
    if profile == "tenstorrent":
        return dict(TENSTORRENT_LABELS)
    if profile == "mixed":
        return dict(INTEL_GPU_LABELS if index % 2 == 0 else TENSTORRENT_LABELS)
    if profile == "plain":
        return {}
    raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")


def node_manifest(
    name: str,
    kernel: str,
    labels: dict[str, str] | None = None,
    arch: str = "amd64",
) -> dict[str, Any]:
    """One kwok-managed Node; its status (kernel, capacity) is kept on create."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            # The beta labels are the controller-manager's to add, which it does late
            # under a big fleet (see cluster.add_nodes): each node is born with them.
            "labels": {
                "kubernetes.io/arch": arch,
                "kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": arch,
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "type": "kwok",
                **(labels or {}),
            },
        },
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "nodeInfo": {
                "architecture": arch,
                "kernelVersion": kernel,
                "operatingSystem": "linux",
                "osImage": OS_IMAGES.get(kernel, "Linux"),
                "kubeletVersion": "kwok",
                "containerRuntimeVersion": "kwok",
                "kubeProxyVersion": "kwok",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        },
    }


def fleet(count: int, profile: str = "mixed", prefix: str = "node") -> list[dict[str, Any]]:
    """``count`` nodes, kernels assigned round-robin so every kernel is present."""
    width = max(3, len(str(count)))
    return [
        node_manifest(
            f"{prefix}-{i:0{width}d}",
            KERNELS[i % len(KERNELS)],
            accelerator_labels(profile, i),
        )
        for i in range(count)
    ]


def set_down(core: Any, node: str, down: bool) -> None:
    """Make a kwok node NotReady (kwok stops playing its kubelet) or bring it back (kwok
    manages it again and marks it Ready)."""
    if not down:
        core.patch_node(node, {"metadata": {"annotations": {KWOK_ANNOTATION: "fake"}}})
        return
    core.patch_node(node, {"metadata": {"annotations": {KWOK_ANNOTATION: None}}})
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": "KubeletNotReady",
        "message": "taken away by the test: kwok no longer serves this node",
    }
    core.patch_node_status(node, {"status": {"conditions": [condition]}})
