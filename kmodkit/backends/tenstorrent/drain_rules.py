"""How the Tenstorrent policies' drain settings map onto the rollout orchestrator.

Pass 1 evicts the pods that hold the device; pass 2 (driver only,
``drain.fullNode``) evicts the rest with kubectl-drain semantics, except the
operator namespace. Deploy gates take sibling DaemonSets (telemetry) off the
node, since DaemonSet pods are never evicted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmodkit.backends.tenstorrent.driver_api import DriverUpgradePolicy
from kmodkit.backends.tenstorrent.firmware_api import FirmwareUpgradePolicy
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.sdk import DeviceEviction, Drain, UpgradePolicy

DEVICE_DIR = "/dev/tenstorrent"
RESOURCE_PREFIX = "tenstorrent.com/"
OWN_PODS = frozenset({"tt-kmd-installer", "tt-flasher"})


def _requests_device(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any(
        str(name).startswith(RESOURCE_PREFIX)
        for part in ("requests", "limits")
        for name in (resources.get(part) or {})
    )


def is_device_consumer(pod: Mapping[str, Any]) -> bool:
    """Whether a pod holds Tenstorrent devices: it mounts /dev/tenstorrent (or a device under it)
    from the host, or was allocated a ``tenstorrent.com/*`` resource. The operator's own builder
    and flash pods are not consumers: the rollout replaces them itself."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get("app.kubernetes.io/name") in OWN_PODS:
        return False
    spec = pod.get("spec") or {}
    for volume in spec.get("volumes") or []:
        path = str((volume.get("hostPath") or {}).get("path") or "").rstrip("/")
        if path == DEVICE_DIR or path.startswith(DEVICE_DIR + "/"):
            return True
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    return any(_requests_device(c) for c in containers)


def gates(enabled: bool, settings: TenstorrentSettings) -> dict[str, str]:
    return dict.fromkeys(settings.deploy_gates, "false") if enabled else {}


NO_CAPACITY_BOUND = "100%"
"""maxUnavailable of both policies. Their knobs, like upstream's, bound what the rollout takes
out of service (``maxParallel``); nodes out of service for other reasons (down, cordoned by an
admin) are left alone and hold no other node back. Counted against a budget of one, a single
such node stopped the whole fleet's rollout."""


def driver_policy(
    upgrade: DriverUpgradePolicy, settings: TenstorrentSettings, operator_namespace: str
) -> UpgradePolicy:
    """Strictly one node at a time. Without drain the node is still cordoned while its driver
    is swapped, but nothing is gated or evicted: a holder left on it makes the builder refuse.
    Pass 2 spares the operator namespace, as upstream's does: the operator and its flash Jobs
    run there (a flash cut off can brick a card)."""
    drain = upgrade.drain
    return UpgradePolicy(
        max_parallel=1,
        max_unavailable=NO_CAPACITY_BOUND,
        halt_on_failure=upgrade.halt_on_failure,
        upgrade_cordoned_nodes=upgrade.upgrade_cordoned_nodes,
        deploy_gates=gates(drain.enable, settings),
        device_eviction=DeviceEviction(force=drain.force, timeout_seconds=drain.timeout_seconds),
        drain=Drain(
            enable=drain.enable and drain.full_node,
            pod_selector=drain.pod_selector_label,
            force=drain.force,
            delete_empty_dir=drain.delete_empty_dir,
            timeout_seconds=drain.timeout_seconds,
            spared_namespaces=[operator_namespace],
        ),
        validation_timeout_seconds=upgrade.upgrade_timeout_seconds,
    )


FLASH_START_MARGIN = 120
"""Seconds allowed beyond the Job deadline for its pod to start (image pull, bundle download)."""


def firmware_policy(upgrade: FirmwareUpgradePolicy, settings: TenstorrentSettings) -> UpgradePolicy:
    """The seed's ``Pending → (Cordoning → Draining)? → Flashing``: without drain the node is
    flashed neither cordoned nor drained, as upstream does."""
    drain = upgrade.drain
    return UpgradePolicy(
        max_parallel=upgrade.max_parallel,
        max_unavailable=NO_CAPACITY_BOUND,
        halt_on_failure=upgrade.halt_on_failure,
        upgrade_cordoned_nodes=upgrade.upgrade_cordoned_nodes,
        cordon=drain.enable,
        deploy_gates=gates(drain.enable, settings),
        device_eviction=DeviceEviction(
            enable=drain.enable, force=drain.force, timeout_seconds=drain.timeout_seconds
        ),
        validation_timeout_seconds=upgrade.flash_timeout_seconds + FLASH_START_MARGIN,
    )
