"""Allocated GPU ResourceClaims: while any exists, the driver must not be pulled away."""

from __future__ import annotations

from collections.abc import Iterable

from kmodkit.sdk import Obj, Watch

DRIVER = "gpu.intel.com"

CLAIMS = Watch(
    name="resourceclaims",
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaims",
    # One claim or more per workload, every driver's: only what tells an Intel GPU's.
    fields=(
        "metadata.name",
        "metadata.namespace",
        "status.allocation.devices.results[].driver",
    ),
)


def allocated_gpu_claims(claims: Iterable[Obj]) -> list[str]:
    """``<namespace>/<name>`` of every claim with a device allocated from Intel's DRA driver."""
    found = []
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        if any(result.get("driver") == DRIVER for result in results):
            meta = claim.get("metadata") or {}
            found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return sorted(found)
