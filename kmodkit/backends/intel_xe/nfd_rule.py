"""The NodeFeatureRule that labels Intel GPU nodes (useNFDLabeling, when NFD is installed).

``gpu-pci`` needs only the PCI device, so the driver's loader can be placed on
a node before any driver works; ``gpu`` needs the i915 or xe module loaded and
places the components that use the GPU. Product and architecture labels help
pick nodes by model.
"""

from __future__ import annotations

from typing import Any

from kmodkit.backends.intel_xe.selectors import NFD_GPU_LABEL, NFD_GPU_PCI_LABEL

NFD_GROUP = "nfd.k8s-sigs.io"
# Display controllers (0300) and other display controllers (0380).
_GPU_CLASSES = ["0300", "0380"]
_PRODUCTS = (
    (["e212"], "Arc_Pro_B50", "Xe2"),
    (["e211"], "Arc_Pro_B60", "Xe2"),
    (["e222"], "Arc_Pro_B65", "Xe2"),
    (["e223"], "Arc_Pro_B70", "Xe2"),
    (["b081", "b083", "b085", "b087"], "Arc_B370", "Xe3"),
    (["b080", "b082", "b084", "b086"], "Arc_B390", "Xe3"),
    (["e20c"], "Arc_B570", "Xe2"),
    (["e20b"], "Arc_B580", "Xe2"),
)


def name(policy: str) -> str:
    return f"{policy}-intel-gpu-devices"


def _pci(classes: list[str], devices: list[str] | None = None) -> dict[str, Any]:
    match: dict[str, Any] = {
        "vendor": {"op": "In", "value": ["8086"]},
        "class": {"op": "In", "value": classes},
    }
    if devices:
        match["device"] = {"op": "In", "value": devices}
    return {"feature": "pci.device", "matchExpressions": match}


def _rules() -> list[dict[str, Any]]:
    driver = {"op": "InRegexp", "value": ["^i915$", "^xe$"]}
    rules: list[dict[str, Any]] = [
        {
            "name": "intel.gpu",
            "labels": {NFD_GPU_LABEL: "true"},
            "matchFeatures": [_pci(_GPU_CLASSES)],
            "matchAny": [
                {
                    "matchFeatures": [
                        {"feature": "kernel.loadedmodule", "matchName": driver},
                    ]
                },
                {
                    "matchFeatures": [
                        {"feature": "kernel.enabledmodule", "matchName": driver},
                    ]
                },
            ],
        },
        {
            "name": "intel.gpu.without-driver",
            "labels": {NFD_GPU_PCI_LABEL: "true"},
            "matchFeatures": [_pci(_GPU_CLASSES)],
        },
    ]
    for devices, product, architecture in _PRODUCTS:
        rules.append(
            {
                "name": f"intel.gpu.{product.lower()}",
                "labels": {
                    "gpu.intel.com/product": product,
                    "gpu.intel.com/architecture": architecture,
                },
                "matchFeatures": [_pci(["0300"], devices)],
            }
        )
    return rules


def manifests(policy: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": f"{NFD_GROUP}/v1alpha1",
            "kind": "NodeFeatureRule",
            "metadata": {"name": name(policy), "labels": {"app": "nfd-gpu", "owner": policy}},
            "spec": {"rules": _rules()},
        }
    ]
