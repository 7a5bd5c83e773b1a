"""What kmodkit needs to know about a Node, read once from the API object.

Every planner works on these small frozen views, never on raw API objects, so
a fleet of 10,000 nodes costs little memory and plans are pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kmodkit.core.interned import interned
from kmodkit.core.kernel import node_kernel

# Taints that say something about the node's state rather than who may run
# there. A cordon or a NotReady spell must not unload a driver (KMM unloads on
# cordon unless the Module tolerates it; operators rarely expect that).
TRANSIENT_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
    }
)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    kernel: str = ""
    """The kernel as KMM reads it: nodeInfo.kernelVersion with one trailing '+' removed."""
    arch: str = ""
    ready: bool = False
    unschedulable: bool = False
    boot_id: str = ""
    taints: tuple[Taint, ...] = ()
    uid: str = ""


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """A NodeView from a Node as the API returns it (a dict, camelCase)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    info = status.get("nodeInfo") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    taints = tuple(
        Taint(t.get("key", ""), t.get("value") or "", t.get("effect", ""))
        for t in spec.get("taints") or []
    )
    return NodeView(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        kernel=node_kernel(info.get("kernelVersion", "")),
        arch=info.get("architecture", ""),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        boot_id=info.get("bootID", ""),
        taints=taints,
        uid=meta.get("uid", ""),
    )


def relabelled(
    nodes: Iterable[NodeView], changes: Mapping[str, Mapping[str, str | None]]
) -> list[NodeView]:
    """``nodes`` with the label ``changes`` by node applied (None removes a label): the
    views the watch will deliver once it shows those writes."""
    out = []
    for node in nodes:
        change = changes.get(node.name)
        if change:
            kept = {k: v for k, v in node.labels.items() if k not in change}
            node = replace(node, labels=kept | {k: v for k, v in change.items() if v is not None})
        out.append(node)
    return out


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Equality match of a map selector, as KMM's ``spec.selector``; {} matches all."""
    return all(labels.get(k) == v for k, v in selector.items())


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Taint) -> bool:
    """Kubernetes' ToleratesTaint for one taint."""
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = t.get("key") or ""
        operator = t.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.key:
            continue
        if operator == "Exists" or (t.get("value") or "") == taint.value:
            return True
    return False


def blocking_taints(node: NodeView, tolerations: Iterable[Mapping[str, Any]]) -> list[Taint]:
    """Taints that keep the Module's pods off ``node`` (transient ones aside)."""
    tols = list(tolerations)
    return [
        t
        for t in node.taints
        if t.effect in ("NoSchedule", "NoExecute")
        and t.key not in TRANSIENT_TAINTS
        and not tolerates(tols, t)
    ]


def slim_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A Node shaped as the API returns it, with only the fields kmodkit reads.

    What the node cache keeps per node instead of the whole object (managed
    fields, images, capacity and most conditions are dropped): enough for
    ``node_view``, event references (name, uid) and the rollout and its hooks
    (labels, annotations, cordon, readiness, and the resourceVersion their
    guarded writes name).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    info = status.get("nodeInfo") or {}
    kept_meta = ("name", "uid", "resourceVersion")
    kept_info = ("kernelVersion", "architecture", "bootID")
    return {
        "metadata": {
            **{k: meta[k] for k in kept_meta if k in meta},
            **{k: interned(meta[k]) for k in ("labels", "annotations") if k in meta},
        },
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {
            "nodeInfo": interned({k: info[k] for k in kept_info if k in info}),
            "conditions": [
                interned({"type": c.get("type"), "status": c.get("status")})
                for c in status.get("conditions") or []
                if c.get("type") == "Ready"
            ],
        },
    }
