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


def _base(spec: ClusterPolicySpec) -> dict[str, str]:
    # The user's labels win, even over the architecture, as in Intel's operator.
    return {ARCH_LABEL: "amd64", **(spec.node_selector or {})}


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
