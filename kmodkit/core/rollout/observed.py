"""What the planner sees: nodes and pods reduced to the facts a decision needs.

The ``*_from`` functions turn raw API objects into these views; they are pure,
and the hook results (which may come from a backend's own state) are passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kmodkit.core.contract.hooks import Obj, Validation
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.states import State, parse_state

CordonOwner = Literal["rollout", "external"]
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class NodeRecord:
    """The rollout's annotations on a node, parsed."""

    since: float | None = None
    cordon: CordonOwner | None = None
    attempt: int = 0
    target: str | None = None
    gates: Mapping[str, str | None] | None = None
    """Deploy-gate label values before the rollout set them (None: label was absent)."""
    reason: str = ""
    message: str = ""
    swap: str | None = None
    """The target whose swap was cleared to start (the marker written before the swap hook)."""

    @property
    def leftovers(self) -> bool:
        """Whether the rollout changed the node in a way it has not undone yet."""
        return self.cordon == "rollout" or self.gates is not None


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    phase: str = "Running"
    terminating: bool = False
    daemonset: bool = False
    mirror: bool = False
    bare: bool = False
    """No controller owns it, so nothing recreates it once evicted."""
    empty_dir: bool = False
    device_consumer: bool = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeView:
    name: str
    state: State | None = None
    record: NodeRecord = field(default_factory=NodeRecord)
    unschedulable: bool = False
    ready: bool = True
    skipped: bool = False
    needs_update: bool = False
    gate_values: Mapping[str, str | None] = field(default_factory=dict)
    """Current values of the policy's deploy-gate labels (None: absent)."""
    pods: tuple[PodView, ...] | None = None
    """Pods relevant to the node's state; listed only for states in NEEDS_PODS."""
    validation: Validation | None = None
    """The backend's verdict; asked only for nodes in ``validating``."""
    uid: str = ""
    resource_version: str = ""
    holder: str | None = None
    """The policy whose rollout has claimed the node (any policy's, not only this one's)."""

    @property
    def available(self) -> bool:
        return self.ready and not self.unschedulable

    @property
    def cordoned_by_others(self) -> bool:
        """Cordoned, and not by this rollout: an admin's maintenance, another tool or policy."""
        return self.unschedulable and self.record.cordon != "rollout"


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _gates(value: str | None) -> Mapping[str, str | None] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return {str(k): (v if isinstance(v, str) else None) for k, v in parsed.items()}


def encode_gates(gates: Mapping[str, str | None]) -> str:
    return json.dumps(dict(sorted(gates.items())), separators=(",", ":"))


def record_from(annotations: Mapping[str, str], keys: RolloutKeys) -> NodeRecord:
    cordon = annotations.get(keys.cordon)
    return NodeRecord(
        since=_float(annotations.get(keys.since)),
        cordon=cordon if cordon in ("rollout", "external") else None,  # type: ignore[arg-type]
        attempt=_int(annotations.get(keys.attempt)),
        target=annotations.get(keys.target),
        gates=_gates(annotations.get(keys.gates)),
        reason=annotations.get(keys.reason, ""),
        message=annotations.get(keys.message, ""),
        swap=annotations.get(keys.swap),
    )


def _metadata(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def is_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_view_from(
    node: Obj,
    keys: RolloutKeys,
    gate_keys: tuple[str, ...],
    *,
    skip_label: str | None,
    needs_update: bool,
    pods: tuple[PodView, ...] | None = None,
    validation: Validation | None = None,
) -> NodeView:
    meta = _metadata(node)
    node_labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    return NodeView(
        name=str(meta.get("name", "")),
        state=parse_state(node_labels.get(keys.state)),
        record=record_from(annotations, keys),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable", False)),
        ready=is_ready(node),
        skipped=skip_label is not None and node_labels.get(skip_label) == "true",
        needs_update=needs_update,
        gate_values={k: node_labels.get(k) for k in gate_keys},
        pods=pods,
        validation=validation,
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        holder=annotations.get(HOLDER_ANNOTATION) or None,
    )


def pod_view_from(pod: Obj, *, device_consumer: bool) -> PodView:
    meta = _metadata(pod)
    owners = meta.get("ownerReferences") or []
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return PodView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        phase=str((pod.get("status") or {}).get("phase", "")),
        terminating=meta.get("deletionTimestamp") is not None,
        daemonset=any(o.get("kind") == "DaemonSet" for o in owners),
        mirror=MIRROR_ANNOTATION in (meta.get("annotations") or {}),
        bare=not any(o.get("controller") for o in owners),
        empty_dir=any("emptyDir" in v for v in volumes),
        device_consumer=device_consumer,
    )
