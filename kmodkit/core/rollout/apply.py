"""The thin I/O layer: node patches, pod listing and evictions.

Each call maps one planned action onto one API request and reports the outcome;
deciding what the outcome means is the planner's job on the next pass.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core.contract.hooks import Obj
from kmodkit.core.labels import FIELD_MANAGER
from kmodkit.core.rollout.observed import PodView
from kmodkit.core.rollout.plan import NodePatch
from kmodkit.core.sending import send

MERGE_PATCH = "application/merge-patch+json"


def patch_body(patch: NodePatch, resource_version: str | None) -> dict[str, Any]:
    """The merge patch for ``patch``; with a resourceVersion it applies only to that version."""
    metadata: dict[str, Any] = {}
    if patch.labels:
        metadata["labels"] = dict(patch.labels)
    if patch.annotations:
        metadata["annotations"] = dict(patch.annotations)
    if resource_version:
        metadata["resourceVersion"] = resource_version
    body: dict[str, Any] = {"metadata": metadata}
    if patch.unschedulable is not None:
        # Uncordoning removes the field, as `kubectl uncordon` does.
        body["spec"] = {"unschedulable": True if patch.unschedulable else None}
    return body


def patch_node(core: client.CoreV1Api, name: str, body: dict[str, Any]) -> str | None:
    """Apply ``body``; the node's resourceVersion after it, or None when refused as stale.

    Stale: the node changed since it was observed (or is gone); the next pass
    re-plans it. The resourceVersion returned ("" if the answer lacks one) is what
    a following write guards on: a no-op patch returns the one it was guarded by,
    so it proves the observed node current without changing it.
    """
    try:
        # Raw JSON, not the client's models (see kmodkit.core.sending): one field is read.
        answer: Any = core.patch_node(
            name,
            body,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )
    except ApiException as e:
        if e.status in (404, 409):
            return None
        raise
    metadata = json.loads(answer.data or b"{}").get("metadata") or {}
    return str(metadata.get("resourceVersion") or "")


def list_pods_on_node(core: client.CoreV1Api, node: str, label_selector: str = "") -> list[Obj]:
    """Pods bound to one node, as raw JSON (cheaper than the client's models)."""
    # Without preloading, the client returns the HTTP response, not a model.
    resp: Any = core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}",
        label_selector=label_selector or None,
        _preload_content=False,
    )
    items: list[Obj] = json.loads(resp.data).get("items") or []
    return items


def node_names(core: client.CoreV1Api, label_selector: str) -> set[str]:
    """The names of the nodes the selector matches (the answer read as raw JSON)."""
    resp: Any = core.list_node(label_selector=label_selector, _preload_content=False)
    return {str(n["metadata"]["name"]) for n in json.loads(resp.data).get("items") or []}


class EvictionOutcome(Enum):
    EVICTED = "evicted"
    GONE = "gone"
    BLOCKED = "blocked"
    """Refused with 429: a PodDisruptionBudget allows no disruption right now."""


def evict(core: client.CoreV1Api, pod: PodView) -> EvictionOutcome:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }
    try:
        send(core.create_namespaced_pod_eviction, pod.name, pod.namespace, cast(Any, body))
    except ApiException as e:
        if e.status == 404:
            return EvictionOutcome.GONE
        if e.status == 429:
            return EvictionOutcome.BLOCKED
        raise
    return EvictionOutcome.EVICTED
