"""What an AcmeDriver becomes: a kmodkit Module and a device plugin gated on it.

The plan is pure: it reads the AcmeDriver and what the runtime observed, and
returns manifests. kmodkit applies them, prunes what is no longer planned, and
its engine loads the Module; the device plugin follows the Module's readiness
label, so it only runs where the driver is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kmodkit.sdk import MODULE_API_VERSION, MODULE_READY_LABEL, ClusterView, Obj, Plan
from kmodkit_example.api import AcmeDriver

DEVICE_PLUGIN_IMAGE = "KMODKIT_ACME_DEVICE_PLUGIN_IMAGE"
"""Operator setting (an environment variable of the operator) naming the device-plugin image."""
DEFAULT_DEVICE_PLUGIN_IMAGE = "registry.example.com/acme/npu-device-plugin:1.0"


def module_manifest(driver: AcmeDriver, name: str, namespace: str) -> dict[str, Any]:
    spec = driver.spec
    module: dict[str, Any] = {
        "apiVersion": MODULE_API_VERSION,
        "kind": "Module",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": dict(spec.node_selector),
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": spec.module_name},
                    "kernelMappings": [{"regexp": "^.+$", "containerImage": spec.image}],
                }
            },
        },
    }
    if spec.image_pull_secret:
        module["spec"]["imageRepoSecret"] = {"name": spec.image_pull_secret}
    return module


def device_plugin_manifest(
    driver: AcmeDriver, name: str, namespace: str, image: str
) -> dict[str, Any]:
    pod_labels = {
        "app.kubernetes.io/name": "acme-npu-device-plugin",
        "app.kubernetes.io/instance": name,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": f"{name}-device-plugin", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": pod_labels},
            "template": {
                # A copy: a shared dict would print as a YAML anchor (kmodkit render).
                "metadata": {"labels": dict(pod_labels)},
                "spec": {
                    # The engine sets this label exactly while the driver is
                    # loaded on the node's running kernel.
                    "nodeSelector": {
                        **driver.spec.node_selector,
                        MODULE_READY_LABEL.key(namespace, name): "",
                    },
                    "containers": [
                        {
                            "name": "device-plugin",
                            "image": image,
                            "volumeMounts": [
                                {"name": "kubelet", "mountPath": "/var/lib/kubelet/device-plugins"}
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "kubelet",
                            "hostPath": {"path": "/var/lib/kubelet/device-plugins"},
                        }
                    ],
                },
            },
        },
    }


def _owned(owned: Sequence[Obj], kind: str) -> Mapping[str, Any]:
    return next((o for o in owned if o.get("kind") == kind), {})


def plan(body: Obj, view: ClusterView) -> Plan:
    driver = AcmeDriver.model_validate(body)
    name, namespace = f"acme-{driver.metadata.name}", view.operator_namespace
    image = view.settings.get(DEVICE_PLUGIN_IMAGE, DEFAULT_DEVICE_PLUGIN_IMAGE)
    module_status = _owned(view.owned, "Module").get("status") or {}
    plugin_status = _owned(view.owned, "DaemonSet").get("status") or {}
    return Plan(
        objects=(
            module_manifest(driver, name, namespace),
            device_plugin_manifest(driver, name, namespace, image),
        ),
        status={
            "module": f"{namespace}/{name}",
            "readyNodes": (module_status.get("moduleLoader") or {}).get("availableNumber", 0),
            "devicePluginPods": plugin_status.get("numberReady", 0),
        },
    )
