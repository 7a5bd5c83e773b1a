"""The device plugin of a Module: one DaemonSet, on the selected nodes where the module is ready.

As KMM, the plugin runs only where the driver is loaded: its pods are gated on
the Module's readiness label, so an unload (an update, a retired node, the
Module's deletion) first sees the plugin leave the node, through the same
gated-pods check every unload makes. A Module without a module loader (an
in-tree driver) runs the plugin on every selected node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kmodkit.core import labels
from kmodkit.core.api import Module
from kmodkit.core.api.device_plugin import DevicePluginContainer
from kmodkit.core.engine.loader_pod import COMPONENT_LABEL, MODULE_LABEL
from kmodkit.core.nodes import NodeView, blocking_taints, selector_matches

DEVICE_PLUGIN_COMPONENT = "device-plugin"
SPEC_HASH = f"{labels.KMODKIT_PREFIX}/spec-hash"
# Where the kubelet expects device plugins' sockets; always mounted, as KMM does.
KUBELET_DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class DaemonSetView:
    """A device-plugin DaemonSet as observed."""

    name: str
    spec_hash: str
    desired: int
    available: int


def daemon_set_view(obj: Mapping[str, Any]) -> DaemonSetView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return DaemonSetView(
        name=meta.get("name", ""),
        spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH, ""),
        desired=int(status.get("desiredNumberScheduled") or 0),
        available=int(status.get("numberAvailable") or 0),
    )


def plugin_labels(
    namespace: str,
    name: str,
    nodes: Iterable[NodeView],
    ready_on: Iterable[str],
) -> dict[str, dict[str, str | None]]:
    """KMM's ``<ns>.<name>.device-plugin-ready`` label exactly on the nodes where a pod of
    the plugin is Ready (``ready_on``); only the changes each node needs."""
    key = labels.DEVICE_PLUGIN_READY.key(namespace, name)
    ready = set(ready_on)
    changes: dict[str, dict[str, str | None]] = {}
    for node in nodes:
        want = "" if node.name in ready else None
        if node.labels.get(key) != want:
            changes[node.name] = {key: want}
    return changes


def daemon_set_name(module: str) -> str:
    return f"{module}-device-plugin"


@dataclass(frozen=True)
class DevicePluginPlan:
    apply: dict[str, Any] | None = None
    """The DaemonSet to create or replace (None: it is as wanted, or not wanted)."""
    delete: tuple[str, ...] = ()
    status: dict[str, Any] | None = None
    """status.devicePlugin, or None when the Module has no device plugin."""


def plan_device_plugin(
    module: Module, nodes: Iterable[NodeView], daemon_sets: Iterable[DaemonSetView]
) -> DevicePluginPlan:
    """What to apply or delete so the Module's device plugin runs as its spec says."""
    observed = {d.name: d for d in daemon_sets}
    wanted = daemon_set(module)
    if wanted is None:
        return DevicePluginPlan(delete=tuple(sorted(observed)))
    current = observed.pop(wanted["metadata"]["name"], None)
    tolerations = module.spec.pod_tolerations()
    selected = sum(
        1
        for n in nodes
        if selector_matches(module.spec.selector, n.labels) and not blocking_taints(n, tolerations)
    )
    stale = current is None or current.spec_hash != wanted["metadata"]["annotations"][SPEC_HASH]
    return DevicePluginPlan(
        apply=wanted if stale else None,
        delete=tuple(sorted(observed)),
        status={
            "nodesMatchingSelectorNumber": selected,
            "desiredNumber": current.desired if current else 0,
            "availableNumber": current.available if current else 0,
        },
    )


def daemon_set(module: Module) -> dict[str, Any] | None:
    """The device plugin's DaemonSet, or None when the Module has none."""
    plugin = module.spec.device_plugin
    if plugin is None:
        return None
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    selector = {MODULE_LABEL: name, COMPONENT_LABEL: DEVICE_PLUGIN_COMPONENT}
    node_selector = dict(module.spec.selector)
    if module.spec.module_loader is not None:
        node_selector[labels.READY.key(ns, name)] = ""
    volumes = [
        {"name": "kubelet-device-plugins", "hostPath": {"path": KUBELET_DEVICE_PLUGINS}},
        *(v.model_dump(by_alias=True, exclude_none=True) for v in plugin.volumes or []),
    ]
    pod_spec: dict[str, Any] = {
        "nodeSelector": node_selector,
        "tolerations": module.spec.pod_tolerations(),
        "containers": [_container("device-plugin", plugin.container, default_mount=True)],
        "volumes": volumes,
    }
    if plugin.init_container is not None:
        pod_spec["initContainers"] = [_container("init", plugin.init_container)]
    if plugin.service_account_name:
        pod_spec["serviceAccountName"] = plugin.service_account_name
    if plugin.automount_service_account_token is not None:
        pod_spec["automountServiceAccountToken"] = plugin.automount_service_account_token
    if module.spec.image_repo_secret is not None:
        pod_spec["imagePullSecrets"] = [{"name": module.spec.image_repo_secret.name}]
    template_labels = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY, **selector}
    spec = {
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": template_labels}, "spec": pod_spec},
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemon_set_name(name),
            "namespace": ns,
            "labels": {**template_labels, labels.MODULE_NAME_LABEL: name},
            "annotations": {SPEC_HASH: digest},
        },
        "spec": spec,
    }


def _container(
    name: str, spec: DevicePluginContainer, default_mount: bool = False
) -> dict[str, Any]:
    body = spec.model_dump(by_alias=True, exclude_none=True)
    mounts = body.pop("volumeMounts", [])
    if default_mount:
        mounts = [{"name": "kubelet-device-plugins", "mountPath": KUBELET_DEVICE_PLUGINS}, *mounts]
    return {"name": name, **body, **({"volumeMounts": mounts} if mounts else {})}
