"""Operator settings (``KMODKIT_INTEL_*``) and the pinned operand images they can override.

The pins are the images Intel's operator ships with: a tag for readers and a
digest so every node runs the same bytes. A mirror for air-gapped clusters is
one setting away; a policy's own image field wins over both.
"""

from __future__ import annotations

from collections.abc import Mapping

DEVICE_PLUGIN_IMAGE = (
    "docker.io/intel/intel-gpu-plugin:0.36.0"
    "@sha256:2db679be62b52ac985169084ca711cab6e6c59fe543ab2ddee58163d6f8d29e0"
)
DRA_IMAGE = (
    "ghcr.io/intel/intel-resource-drivers-for-kubernetes/intel-gpu-resource-driver:v0.11.0"
    "@sha256:49f38fcbee4f98d748b537b1a728a12f39e56fd208c86dc3fa32ab2162c21197"
)
XPU_MANAGER_IMAGE = (
    "ghcr.io/intel/xpumanager/xpumd:v2.0.0"
    "@sha256:bd6bad4f95274832ce6863c6f7744fc73a610903617d9def2932588138be0b85"
)

ENGINE = "KMODKIT_INTEL_ENGINE"
"""auto (default), kmm or builtin: the engine for policies whose kernelModule.engine is Auto."""
DRA = "KMODKIT_INTEL_DRA"
"""Set to ``disabled`` to keep the DRA driver off even where resource.k8s.io is served."""
DRA_GROUP = "resource.k8s.io"
MODULE_LOADER_SERVICE_ACCOUNT = "KMODKIT_INTEL_MODULE_LOADER_SERVICE_ACCOUNT"
"""Service account of the module-loader pods; unset leaves the engine's default."""
DEVICE_PLUGIN_IMAGE_SETTING = "KMODKIT_INTEL_DEVICE_PLUGIN_IMAGE"
DRA_IMAGE_SETTING = "KMODKIT_INTEL_DRA_IMAGE"
XPU_MANAGER_IMAGE_SETTING = "KMODKIT_INTEL_XPU_MANAGER_IMAGE"


def image(spec_value: str | None, settings: Mapping[str, str], key: str, pinned: str) -> str:
    """The image to run: the policy's, else the operator's setting, else the pin."""
    return spec_value or settings.get(key) or pinned


def dra_served(settings: Mapping[str, str], api_groups: frozenset[str]) -> bool:
    """Whether the cluster serves DRA (read from the apiserver) and the operator allows it."""
    return DRA_GROUP in api_groups and settings.get(DRA, "").lower() != "disabled"
