"""The harness's invariants, checked at every change its watches see.

Independent of the operator: it reads only what the apiserver says (nodes,
pods, Jobs), never the operator's own view. Every check that runs counts in
``checks``; every breach is kept with the history of the node involved.

Rollout nodes (the Tenstorrent driver and firmware fleets):
- a node's state moves only along the legal transitions (checked between
  consecutive changes of one stream; a fresh list may skip changes, so the
  first change after one is not checked);
- never more nodes in flight than ``maxParallel``; a node still in service is
  started only while fewer than ``maxUnavailable`` others are out of service (in flight, or cordoned
  or NotReady and not finished with). A node whose readiness changed in the last
  ``SETTLE`` seconds is not counted for that: the operator cannot have seen it;
- the node an admin cordoned stays cordoned at every change;
- each node is swapped once per target: one builder pod per (node, builder
  template), one flash Job per (node, firmware version).

Module nodes:
- no unloader pod ever (nothing is deselected), no loader pod of the unchanged
  Module is deleted and its ready label is never removed;
- the changing Module never has more than its maxUnavailable nodes that are not
  settled (the newest live loader pod Ready) once every node was: a node whose
  loader is being replaced counts from its successor's creation until the
  successor is Ready. (The operator takes a node out a little earlier, when it
  removes the ready label; that stretch is not counted here.)
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kmodkit.backends.tenstorrent import keys as tt_keys
from kmodkit.core.engine.loader_pod import COMPONENT_LABEL, MODULE_LABEL, UNLOADER_COMPONENT
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.states import IN_FLIGHT, State, parse_state
from tests.unit.core.rollout.test_rollout_machine import LEGAL

SETTLE = 5.0
THROUGH = (State.DONE, State.FAILED)


@dataclass(frozen=True)
class RolloutFleet:
    """One rollout's nodes and its budget."""

    name: str
    keys: RolloutKeys
    nodes: frozenset[str]
    max_parallel: int
    max_unavailable: int


@dataclass
class NodeSeen:
    cordoned: bool = False
    ready: bool = True
    ready_changed: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _settled(loaders: Mapping[str, tuple[str, bool]]) -> bool:
    """The node's newest live loader pod is Ready: it is neither waiting for a
    successor nor without its module. A predecessor not yet deleted next to a
    Ready successor takes nothing away (the operator deletes it in the pass that
    frees the node's slot)."""
    return bool(loaders) and max(loaders.values())[1]


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Invariants:
    def __init__(
        self,
        rollouts: list[RolloutFleet],
        external_cordon: str,
        stable_module: str,
        stable_ready_label: str,
        changing_module: str,
        module_nodes: frozenset[str],
        module_max_unavailable: int,
    ) -> None:
        self.rollouts = rollouts
        self.external_cordon = external_cordon
        self.stable_module = stable_module
        self.stable_ready_label = stable_ready_label
        self.changing_module = changing_module
        self.module_nodes = module_nodes
        self.module_max_unavailable = module_max_unavailable
        self.checks = 0
        self.violations: list[str] = []
        self.nodes: dict[str, NodeSeen] = defaultdict(NodeSeen)
        self.states: dict[str, dict[str, State | None]] = {r.name: {} for r in rollouts}
        self.builders: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.flash_jobs: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.stable_loaders: dict[str, str] = {}
        """uid -> node, of the unchanged Module's loader pods, as first seen."""
        self.loaders: dict[str, dict[str, tuple[str, bool]]] = defaultdict(dict)
        """node -> uid -> (created, Ready), of the changing Module's live loader pods."""
        self.module_budget_armed = False
        self.max_in_flight: dict[str, int] = defaultdict(int)
        self.max_module_unavailable = 0
        self.readiness_changes = 0
        self.breaches = 0
        self._seen: set[str] = set()
        """Violations already reported (one breach is seen by many checks)."""
        self._lock = threading.Lock()

    # -- reporting -------------------------------------------------------------------

    def check(self, ok: bool, what: str, node: str | None = None) -> None:
        self.checks += 1
        if not ok:
            self.breaches += 1
        if not ok and what not in self._seen:
            self._seen.add(what)
            history = "\n    ".join(self.nodes[node].history[-30:]) if node else ""
            self.violations.append(
                what + (f"\n  history of {node}:\n    {history}" if node else "")
            )

    # -- nodes -----------------------------------------------------------------------

    def node_event(self, kind: str, node: dict[str, Any], relisted: bool) -> None:
        with self._lock:
            self._node_event(kind, node, relisted)

    def _node_event(self, kind: str, node: dict[str, Any], relisted: bool) -> None:
        meta = node["metadata"]
        name = meta["name"]
        seen = self.nodes[name]
        labels = meta.get("labels") or {}
        now = time.monotonic()
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        ready = _ready(node)
        if ready != seen.ready:
            seen.ready_changed = now
            self.readiness_changes += 1
        if self.stable_ready_label in seen.labels and kind != "DELETED":
            self.check(
                self.stable_ready_label in labels,
                f"the unchanged Module's ready label was removed from {name}",
                name,
            )
        for r in self.rollouts:
            if name not in r.nodes:
                continue
            state = parse_state(labels.get(r.keys.state))
            before = self.states[r.name].get(name)
            seen.history.append(
                f"{now:.2f} {kind} rv={meta.get('resourceVersion')} {r.name}: {before} -> "
                f"{state} cordoned={cordoned} ready={ready}"
            )
            if state != before and not relisted:
                self.check(
                    (before, state) in LEGAL,
                    f"{r.name}: illegal move {before} -> {state} on {name}",
                    name,
                )
            # Starting a node already out of service takes nothing more away.
            already_out = seen.cordoned or not seen.ready
            if before is State.REQUIRED and state is State.CORDONING and not already_out:
                out = self._out_of_service(r, now, besides=name)
                self.check(
                    len(out) < r.max_unavailable,
                    f"{r.name}: {name} started while {sorted(out)} were out of service "
                    f"(maxUnavailable {r.max_unavailable})",
                    name,
                )
            self.states[r.name][name] = state
            in_flight = sum(1 for s in self.states[r.name].values() if s in IN_FLIGHT)
            self.max_in_flight[r.name] = max(self.max_in_flight[r.name], in_flight)
            self.check(
                in_flight <= r.max_parallel,
                f"{r.name}: {in_flight} nodes in flight (maxParallel {r.max_parallel})",
                name,
            )
        if name == self.external_cordon and kind != "DELETED":
            self.check(cordoned, f"the admin's cordon on {name} was lifted", name)
        seen.cordoned, seen.ready, seen.labels = cordoned, ready, dict(labels)

    def _out_of_service(self, r: RolloutFleet, now: float, besides: str) -> set[str]:
        out = set()
        for name in r.nodes - {besides}:
            seen, state = self.nodes[name], self.states[r.name].get(name)
            settled = now - seen.ready_changed >= SETTLE
            down = seen.cordoned or (not seen.ready and settled)
            if state in IN_FLIGHT or (down and state not in THROUGH):
                out.add(name)
        return out

    # -- pods and Jobs -----------------------------------------------------------------

    def pod_event(self, kind: str, pod: dict[str, Any], relisted: bool) -> None:
        with self._lock:
            self._pod_event(kind, pod)

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName") or ""
        uid = meta["uid"]
        if labels.get(COMPONENT_LABEL) == UNLOADER_COMPONENT:
            self.check(False, f"an unloader pod {meta['name']} was created on {node}", node)
            return
        template = annotations.get(tt_keys.TT_TEMPLATE_HASH_ANNOTATION)
        if meta["name"].startswith("ttdrv-") and template and node:
            seen = self.builders[(node, template)]
            seen.add(uid)
            self.check(
                len(seen) == 1,
                f"{node} got {len(seen)} builder pods at template {template}: swapped twice",
                node,
            )
            return
        module = labels.get(MODULE_LABEL)
        if module == self.stable_module and node:
            gone = kind == "DELETED" or bool(meta.get("deletionTimestamp"))
            if uid not in self.stable_loaders:
                self.stable_loaders[uid] = node
            self.check(
                not gone, f"a loader pod of the unchanged Module was deleted on {node}", node
            )
        elif module == self.changing_module and node:
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                self.loaders[node].pop(uid, None)
            else:
                self.loaders[node][uid] = (meta["creationTimestamp"], _pod_ready(pod))
            self.nodes[node].history.append(
                f"{time.monotonic():.2f} {kind} loader {meta['name']} uid={uid[:8]} "
                f"deleting={bool(meta.get('deletionTimestamp'))} ready={_pod_ready(pod)}"
            )
            if not self.module_budget_armed:
                return
            busy = [n for n in self.module_nodes if not _settled(self.loaders.get(n, {}))]
            self.max_module_unavailable = max(self.max_module_unavailable, len(busy))
            self.check(
                len(busy) <= self.module_max_unavailable,
                f"{len(busy)} nodes without a settled loader of {module} "
                f"(maxUnavailable {self.module_max_unavailable}): {sorted(busy)[:5]}...",
                node,
            )

    def arm_module_budget(self) -> None:
        """From now on every Module node has had a Ready loader: the budget applies."""
        with self._lock:
            missing = [n for n in self.module_nodes if not _settled(self.loaders.get(n, {}))]
            assert not missing, f"{len(missing)} Module nodes have no settled loader yet"
            self.module_budget_armed = True

    def job_event(self, kind: str, job: dict[str, Any], relisted: bool) -> None:
        labels = job["metadata"].get("labels") or {}
        node = labels.get(tt_keys.TT_FIRMWARE_NODE_LABEL)
        version = labels.get(tt_keys.TT_FIRMWARE_VERSION_LABEL)
        if not node or not version:
            return
        with self._lock:
            seen = self.flash_jobs[(node, version)]
            seen.add(job["metadata"]["uid"])
            self.check(
                len(seen) == 1, f"{node} got {len(seen)} flash Jobs for {version}: flashed twice"
            )
