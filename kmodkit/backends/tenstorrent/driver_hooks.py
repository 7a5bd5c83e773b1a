"""The driver rollout's hooks: which nodes need the new tt-kmd, the swap, and the check.

The swap deletes the node's outdated builder pod; the DaemonSet (``OnDelete``)
recreates it from the current template, and the new pod, seeing the rollout
has the node (its state label is ``swapping`` or ``validating``), unloads the
old tt-kmd, builds or takes the new one from its cache, and loads it. The node
is healthy again when that pod is Ready at the new template and the builder
has labelled the node with the version it loaded.

Builders that need only a restart (see ``driver_changes``) are replaced
outside the rollout, by ``restart``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.backends.tenstorrent import keys
from kmodkit.backends.tenstorrent.builder_pods import BuilderPod
from kmodkit.backends.tenstorrent.drain_rules import is_device_consumer
from kmodkit.backends.tenstorrent.driver_changes import (
    DriverTarget,
    is_outdated,
    is_standing_by,
    needs_rollout,
)
from kmodkit.sdk import Obj, Pending, Validated, Validation


def _labels(node: Obj) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _name(node: Obj) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def verdict(
    node_labels: Mapping[str, str], pod: BuilderPod | None, target: DriverTarget
) -> Validation:
    if pod is None or pod.deleting or is_outdated(pod, target) or is_standing_by(node_labels, pod):
        return Pending("waiting for the new builder pod")
    if pod.image_pull_problem:
        return Pending(f"the builder image cannot be pulled ({pod.image_pull_problem})")
    if pod.crash_loop:
        return Pending(f"the builder keeps failing: {pod.last_error or 'see its log'}")
    loaded = node_labels.get(keys.TT_KMD_VERSION_LABEL, "")
    if pod.ready and loaded == target.version:
        return Validated()
    return Pending(f"building and loading tt-kmd {target.version} (loaded: {loaded or 'none'})")


class DriverHooks:
    """``kmodkit.sdk.RolloutHooks`` for one driver policy."""

    def __init__(self, api: Any, pods: Mapping[str, BuilderPod], target: DriverTarget) -> None:
        self._core = client.CoreV1Api(api)
        self._pods = pods
        self._target = target

    def needs_update(self, node: Obj) -> bool:
        return needs_rollout(_labels(node), self._pods.get(_name(node)), self._target)

    def is_device_consumer(self, pod: Obj) -> bool:
        return self._target.drain and is_device_consumer(pod)

    def swap(self, node: Obj) -> None:
        self._replace_if_due(_labels(node), self._pods.get(_name(node)))

    def validate(self, node: Obj) -> Validation:
        pod = self._pods.get(_name(node))
        # A pod made from an older template, or refusing the unload with the old
        # forceUnload setting (an admin changed it to unblock this node), is replaced
        # again: the swap is idempotent.
        self._replace_if_due(_labels(node), pod)
        return verdict(_labels(node), pod, self._target)

    def restart(self, pods: Sequence[BuilderPod]) -> None:
        """Replace builders that need no reload (``driver_changes.builders_to_restart``)."""
        for pod in pods:
            self._replace_if_due({}, pod)

    def _replace_if_due(self, node_labels: Mapping[str, str], pod: BuilderPod | None) -> None:
        if pod is None or pod.deleting:
            return
        if not is_outdated(pod, self._target) and not is_standing_by(node_labels, pod):
            return
        try:
            self._core.delete_namespaced_pod(pod.name, pod.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
