"""Release the nodes that leave a rollout's request while the rollout is on them.

A node stops being one of the policy's target nodes when the policy's selector
shrinks, the node is relabelled, or another policy takes it over. Nothing else
looks at such a node again, so whatever the rollout left on it (its cordon, the
deploy-gate values it replaced, its keys, its claim) would stay for good. Each
pass therefore takes the rollout off every such node with the patch a deleted
policy's nodes get (``abandon_patch``), guarded by the node's resourceVersion,
except where taking it off could hand a half-changed device back to workloads
and to other rollouts (see ``departure_of`` and docs/rollout.md).

Pure: the decisions and patches; ``reconcile`` writes them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kmodkit.core.contract.hooks import Obj
from kmodkit.core.rollout.abandon import abandon_patch
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import record_from
from kmodkit.core.rollout.states import State, parse_state

LEFT_MID_CHANGE = "LeftDuringChange"
RELEASED = "RolloutReleased"
LEFT_FAILED = "LeftFailed"


class Action(Enum):
    RELEASE = "release"
    """Take the rollout off the node: ``abandon_patch``."""
    FAIL = "fail"
    """The node left while its change was under way: it becomes ``failed`` and is kept."""
    HOLD = "hold"
    """A failed node under this rollout's cordon: left as it is until an admin uncordons it."""


@dataclass(frozen=True)
class Departure:
    """What happens to one node that carries this rollout's marks but is not targeted."""

    node: str
    before: State | None
    action: Action
    reason: str
    message: str
    body: dict[str, Any] | None = None
    """The merge patch, carrying the observed resourceVersion; None for ``HOLD``."""

    @property
    def warning(self) -> bool:
        return self.action is not Action.RELEASE or self.before in (
            State.SWAPPING,
            State.VALIDATING,
        )


def _meta(node: Obj) -> dict[str, Any]:
    meta = node.get("metadata") or {}
    return meta if isinstance(meta, dict) else {}


def _cordoned_by_rollout(node: Obj, keys: RolloutKeys) -> bool:
    annotations = _meta(node).get("annotations") or {}
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    return unschedulable and record_from(annotations, keys).cordon == "rollout"


def _mid_change(state: State | None, swap_marker: str | None) -> bool:
    """Whether the backend's change may be under way: the swap hook is only ever called
    after its marker write lands, so ``swapping`` without a marker changed nothing yet."""
    return state is State.VALIDATING or (state is State.SWAPPING and swap_marker is not None)


def _guarded(body: dict[str, Any], resource_version: str) -> dict[str, Any]:
    body["metadata"]["resourceVersion"] = resource_version
    return body


def departure_of(node: Obj, keys: RolloutKeys, now: float) -> Departure | None:
    """The departure of one untargeted node; None when the rollout left nothing on it.

    - A failed node under this rollout's cordon is kept as it is (``HOLD``): it may be
      half-changed, and the cordon is the admin's signal that it needs a look, as for a
      failed node the rollout still targets. Once the admin lifts that cordon (or clears
      its state label with ``kubectl kmodkit retry``) it is released.
    - A node whose change may be under way (``validating``, or ``swapping`` once the
      swap's marker is written) under this rollout's cordon is moved to ``failed``
      (``FAIL``), keeping the cordon, the gates and the claim: nothing checks the change
      any more, and released, a half-flashed card or half-loaded driver would go back to
      workloads and to the next rollout (a driver drain evicting a running flash).
    - Every other node is released (``RELEASE``): before the swap the device was never
      touched, and after validation it is healthy. Without this rollout's cordon there
      is nothing to keep the node out of service with, so it is released too.
    """
    body = abandon_patch(node, keys)
    if body is None:
        return None  # the common case, decided from a few key lookups
    meta = _meta(node)
    name = str(meta.get("name", ""))
    node_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    state = parse_state(node_labels.get(keys.state))
    record = record_from(annotations, keys)
    resource_version = str(meta.get("resourceVersion") or "")
    policy = keys.holder_id
    cordoned = _cordoned_by_rollout(node, keys)
    if state is State.FAILED and cordoned:
        return Departure(
            name,
            state,
            Action.HOLD,
            LEFT_FAILED,
            f"node {name} is no longer targeted by rollout {policy}, which failed here "
            f"({record.reason or 'no reason recorded'}): it stays cordoned, "
            "since the device may be half-changed; check it, then uncordon it "
            "(kubectl uncordon) and the rollout releases it",
        )
    if _mid_change(state, record.swap) and cordoned:
        message = (
            f"node {name} left rollout {policy} while its change was under way "
            f"(state {state.value if state else 'idle'}): kept cordoned and claimed as failed, "
            "since the device may be half-changed; check it, then uncordon it "
            "(kubectl uncordon) and the rollout releases it"
        )
        patch: dict[str, Any] = {
            "metadata": {
                "labels": {keys.state: State.FAILED.value},
                "annotations": {
                    keys.since: str(int(now)),
                    keys.reason: LEFT_MID_CHANGE,
                    keys.message: message,
                    keys.swap: None,
                },
            }
        }
        if annotations.get(HOLDER_ANNOTATION) is None:
            patch["metadata"]["annotations"][HOLDER_ANNOTATION] = policy
        return Departure(
            name, state, Action.FAIL, LEFT_MID_CHANGE, message, _guarded(patch, resource_version)
        )
    before = state.value if state is not None else "idle"
    message = f"node {name} is no longer targeted by rollout {policy}; released from {before}"
    if cordoned:
        message += ", uncordoned"
    if _mid_change(state, record.swap):
        message += " (its change may be incomplete; it was not under the rollout's cordon)"
    return Departure(
        name, state, Action.RELEASE, RELEASED, message, _guarded(body, resource_version)
    )


def departures(
    nodes: Iterable[Obj], targeted: Collection[str], keys: RolloutKeys, now: float
) -> list[Departure]:
    """The departures of ``nodes`` (every node the caller knows) outside ``targeted``."""
    result = []
    for node in nodes:
        if str(_meta(node).get("name", "")) in targeted:
            continue
        departure = departure_of(node, keys, now)
        if departure is not None:
            result.append(departure)
    return result
