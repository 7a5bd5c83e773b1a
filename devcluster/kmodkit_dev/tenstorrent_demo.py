"""Objects that show the Tenstorrent flows on a simulated fleet (the demo and the tests use them).

Pure manifests: a policy of each kind, a workload holding the device on one
node, a telemetry DaemonSet behind its deploy gate, and a PodDisruptionBudget
that blocks a holder's eviction. On kwok nothing runs inside the builder pods,
so ``builder_report`` gives the node labels a real builder would write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmodkit.backends.tenstorrent import keys
from kmodkit.backends.tenstorrent.driver_api import API_VERSION as DRIVER_API
from kmodkit.backends.tenstorrent.firmware_api import API_VERSION as FIRMWARE_API
from kmodkit.backends.tenstorrent.settings import DEFAULT_DEPLOY_GATES

HOLDER_APP = "tt-inference"


FLASHER_ACCOUNT = "tt-flasher"
"""The flash pods' account in the demo and the tests (the chart makes its own): no role, no
token, as the chart's."""


def flasher_account() -> dict[str, Any]:
    return {"metadata": {"name": FLASHER_ACCOUNT}, "automountServiceAccountToken": False}


def driver_policy(
    name: str, version: str, selector: Mapping[str, str], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": DRIVER_API,
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": name},
        "spec": {"version": version, "nodeAffinity": {"matchLabels": dict(selector)}, **spec},
    }


def firmware_policy(
    name: str, version: str, selector: Mapping[str, str], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": FIRMWARE_API,
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": {"name": name},
        "spec": {"version": version, "nodeAffinity": {"matchLabels": dict(selector)}, **spec},
    }


def device_holder(node: str) -> dict[str, Any]:
    """A Deployment whose one pod runs on ``node`` with /dev/tenstorrent mounted."""
    pod_labels = {"app": HOLDER_APP, "node": node}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"holder-{node}"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [
                        {
                            "name": "inference",
                            "image": "registry.invalid/inference:1",
                            "volumeMounts": [{"name": "dev", "mountPath": "/dev/tenstorrent"}],
                        }
                    ],
                    "volumes": [{"name": "dev", "hostPath": {"path": "/dev/tenstorrent"}}],
                },
            },
        },
    }


def telemetry_daemonset(selector: Mapping[str, str]) -> dict[str, Any]:
    """A sibling DaemonSet that follows the deploy-gate contract: it runs where the gate is true."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "tt-telemetry"},
        "spec": {
            "selector": {"matchLabels": {"app": "tt-telemetry"}},
            "template": {
                "metadata": {"labels": {"app": "tt-telemetry"}},
                "spec": {
                    "nodeSelector": {DEFAULT_DEPLOY_GATES[0]: "true", **selector},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "telemetry", "image": "registry.invalid/telemetry:1"}],
                },
            },
        },
    }


def blocking_pdb(node: str) -> dict[str, Any]:
    """Refuses every eviction of ``node``'s device holder."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"pdb-{node}"},
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {"app": HOLDER_APP, "node": node}},
        },
    }


def builder_report(version: str, dkms: bool, tt_smi: str = "5.2.0") -> dict[str, str]:
    """The node labels the builder writes once it has run: host mode, or what it loaded."""
    if dkms:
        return {keys.TT_INSTALL_MODE_LABEL: "host"}
    return {
        keys.TT_INSTALL_MODE_LABEL: "container",
        keys.TT_KMD_VERSION_LABEL: version,
        keys.TT_SMI_VERSION_LABEL: tt_smi,
    }
