"""Node selectors: which nodes get the driver, and which get the GPU components.

The driver goes wherever an Intel GPU *device* is (NFD's ``gpu-pci`` label
needs no driver), while the device plugin, DRA driver and XPU Manager need a
working driver: NFD's ``gpu`` label, and with an out-of-tree driver the
engine's readiness label, so they start only where the driver is loaded.
"""

from __future__ import annotations

from kmodkit.backends.intel_xe.api import ClusterPolicySpec

ARCH_LABEL = "kubernetes.io/arch"
NFD_GPU_LABEL = "intel.feature.node.kubernetes.io/gpu"
NFD_GPU_PCI_LABEL = "intel.feature.node.kubernetes.io/gpu-pci"


ARCH = "amd64"


def _base(spec: ClusterPolicySpec) -> dict[str, str]:
    # The architecture is always required, as the documentation promises (Intel's
    # operator lets nodeSelector override it; arch_conflict reports such a selector).
    return {**(spec.node_selector or {}), ARCH_LABEL: ARCH}


def arch_conflict(spec: ClusterPolicySpec) -> str | None:
    """The error for a nodeSelector that names another architecture, if it does."""
    wanted = (spec.node_selector or {}).get(ARCH_LABEL)
    if wanted is None or wanted == ARCH:
        return None
    return (
        f"spec.nodeSelector: {ARCH_LABEL}={wanted} conflicts with {ARCH_LABEL}: {ARCH}, which "
        f"is always required (the Intel GPU components and driver are built for {ARCH}); "
        f"remove it or set it to {ARCH}"
    )


def module_selector(spec: ClusterPolicySpec) -> dict[str, str]:
    """Nodes that get the out-of-tree driver (never gated on its own readiness)."""
    selector = _base(spec)
    if spec.use_nfd_labeling:
        selector[NFD_GPU_PCI_LABEL] = "true"
    return selector


def operand_selector(spec: ClusterPolicySpec, ready_label: str | None) -> dict[str, str]:
    """Nodes that run the device plugin, DRA driver and XPU Manager."""
    selector = _base(spec)
    if spec.use_nfd_labeling:
        selector[NFD_GPU_LABEL] = "true"
    if ready_label is not None:
        selector[ready_label] = ""
    return selector
