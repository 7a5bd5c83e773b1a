"""Undo a rollout's marks on its nodes when its policy goes away.

A policy deleted mid-rollout must not leave a node cordoned or a sibling
component gated off: every node the rollout touched gets back what the
rollout's own annotations say it changed (its cordon, the deploy-gate label
values it replaced), and loses the rollout's keys. A cordon an admin made
stays, as it does at the end of a normal rollout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes import client

from kmodkit.core.contract.hooks import Obj
from kmodkit.core.rollout.apply import patch_node
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import record_from


def abandon_patch(node: Obj, keys: RolloutKeys) -> dict[str, Any] | None:
    """The merge patch that takes the rollout off ``node``; None when it holds nothing."""
    meta = node.get("metadata") or {}
    node_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    holds = annotations.get(HOLDER_ANNOTATION) == keys.holder_id
    if (
        keys.state not in node_labels
        and not holds
        and not any(k in annotations for k in keys.annotations())
    ):
        return None
    record = record_from(annotations, keys)
    label_patch: dict[str, str | None] = {keys.state: None}
    for gate, previous in (record.gates or {}).items():
        label_patch[gate] = previous
    body: dict[str, Any] = {
        "metadata": {
            "labels": label_patch,
            "annotations": dict.fromkeys(keys.annotations()),
        }
    }
    if holds:
        # Left behind, the claim would keep every other rollout off the node for good.
        body["metadata"]["annotations"][HOLDER_ANNOTATION] = None
    if record.cordon == "rollout":
        body["spec"] = {"unschedulable": None}
    return body


def abandon(api: Any, policy_id: str, nodes: Iterable[Obj]) -> None:
    """Remove rollout ``policy_id`` from ``nodes`` (raw Node JSON), idempotently."""
    core = client.CoreV1Api(api)
    keys = RolloutKeys.for_policy(policy_id)
    for node in nodes:
        body = abandon_patch(node, keys)
        if body is not None:
            patch_node(core, str((node.get("metadata") or {}).get("name")), body)
