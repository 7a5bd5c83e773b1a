"""Kubernetes Events for rollout transitions, shown by ``kubectl describe``."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client

from kmodkit.core.labels import FIELD_MANAGER

COMPONENT = "kmodkit-rollout"
MAX_EVENT_MESSAGE = 1024


def node_reference(node: Mapping[str, Any]) -> dict[str, str]:
    """The event reference of a node; ``kubectl describe node`` matches on name and uid."""
    meta = node.get("metadata") or {}
    ref = {"apiVersion": "v1", "kind": "Node", "name": str(meta.get("name", ""))}
    if meta.get("uid"):
        ref["uid"] = str(meta["uid"])
    return ref


def emit(
    core: client.CoreV1Api,
    involved: Mapping[str, str],
    reason: str,
    message: str,
    *,
    warning: bool,
) -> None:
    """Create one Event about ``involved`` (a Node, or a policy's object reference)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = involved.get("namespace") or "default"
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{involved.get('name', 'rollout')}.{uuid.uuid4().hex[:16]}",
            "namespace": namespace,
        },
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:MAX_EVENT_MESSAGE],
        "type": "Warning" if warning else "Normal",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": COMPONENT,
    }
    core.create_namespaced_event(namespace, cast(Any, body))
