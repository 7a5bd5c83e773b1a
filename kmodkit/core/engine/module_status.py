"""A Module's status from a loader plan: KMM's counters, conditions, failures.

Pure: the engine compares the result with what the object already says and
writes only when something changed, keeping lastTransitionTime stable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kmodkit.core.api.status import DEGRADED, MAX_NODE_FAILURES, PROGRESSING, READY
from kmodkit.core.engine.loader_plan import LoaderPlan, Phase

MAX_UNCHECKED_IMAGES = 3


MAX_REFUSED_WRITES = 3
"""Refused writes named in a condition; the Events name each one."""


def module_status(
    body: Mapping[str, Any],
    plan: LoaderPlan,
    invalid: str = "",
    apply_failures: Sequence[str] = (),
) -> dict[str, Any]:
    """``apply_failures``: the writes of the pass the API server refused, with its messages."""
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    old = {c.get("type"): c for c in (body.get("status") or {}).get("conditions") or []}
    phases = Counter(o.phase for o in plan.outcomes)
    failures = [o for o in plan.outcomes if o.phase is Phase.FAILED]
    loaded = phases[Phase.LOADED]
    unmapped = [o for o in plan.outcomes if o.phase is Phase.UNMAPPED]
    # As KMM: a node no mapping serves is not desired (and not failing).
    desired = sum(n for p, n in phases.items() if p not in (Phase.WAITING, Phase.UNMAPPED)) + sum(
        1 for o in plan.outcomes if o.phase is Phase.WAITING and o.reason != "AwaitingVersionLabel"
    )
    busy = (
        phases[Phase.LOADING]
        + phases[Phase.UPDATING]
        + sum(
            1
            for o in plan.outcomes
            if o.phase is Phase.WAITING and o.reason != "AwaitingVersionLabel"
        )
    )
    problem = invalid or plan.module_error
    # Why images cannot be checked (a registry fault, a malformed pull secret) is the same
    # for every node of an image: say it once per image, or status would never show it.
    unchecked = list(dict.fromkeys(o.message for o in plan.outcomes if o.reason == "CheckingImage"))

    def cond(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        status = "True" if ok else "False"
        prior = old.get(kind) or {}
        since = prior.get("lastTransitionTime") if prior.get("status") == status else None
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": since or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "observedGeneration": generation,
        }

    reasons = Counter(f.reason for f in failures)
    summary = ", ".join(f"{n} {r}" for r, n in reasons.most_common())
    refused = (
        f"{len(apply_failures)} writes refused: "
        + "; ".join(apply_failures[:MAX_REFUSED_WRITES])
        + ("; ..." if len(apply_failures) > MAX_REFUSED_WRITES else "")
    )
    trouble = (
        ("Invalid", problem)
        if problem
        else ("ApplyFailed", refused)
        if apply_failures
        else ("NodesFailing", f"{len(failures)} nodes failing: {summary}")
        if failures
        else None
    )
    loaded_message = (
        f"{loaded}/{desired} nodes loaded"
        + (f"; failing: {summary}" if failures else "")
        + (f"; {len(unmapped)} selected nodes have no kernel mapping" if unmapped else "")
    )
    conditions = [
        cond(
            READY,
            trouble is None and busy == 0,
            trouble[0] if trouble else "Progressing" if busy else "AllLoaded",
            problem or (f"{loaded_message}; {refused}" if apply_failures else loaded_message),
        ),
        cond(
            PROGRESSING,
            not problem and busy > 0,
            "Rolling" if busy else "Stable",
            f"{busy} nodes loading, updating or waiting for an image"
            + "".join(f"; {why}" for why in unchecked[:MAX_UNCHECKED_IMAGES])
            if busy
            else "nothing in progress",
        ),
        cond(
            DEGRADED,
            trouble is not None,
            trouble[0] if trouble else "AsExpected",
            trouble[1] if trouble else "",
        ),
    ]
    status: dict[str, Any] = {
        "conditions": conditions,
        "moduleLoader": {
            "nodesMatchingSelectorNumber": plan.targeted,
            "desiredNumber": desired,
            "availableNumber": loaded,
            "readyNumber": loaded,
        },
        "nodeFailures": [
            {
                k: v
                for k, v in {
                    "node": f.node,
                    "mappingIndex": f.mapping_index,
                    "reason": f.reason,
                    "message": f.message[:1024],
                }.items()
                if v is not None
            }
            for f in failures[:MAX_NODE_FAILURES]
        ],
        "unmappedNodes": [
            {"node": u.node, "kernel": u.kernel} for u in unmapped[:MAX_NODE_FAILURES]
        ],
    }
    if not invalid:
        status.update(_rebuild_trigger(body))
    return status


def _rebuild_trigger(body: Mapping[str, Any]) -> dict[str, Any]:
    """KMM's ``status.imageRebuildTriggerGeneration``: the trigger this pass acted on.

    The pass that writes this status re-checked the images and reset build
    back-off under the spec's value, so echoing it says the bump was applied.
    The status is merge-patched, so a trigger removed from the spec is cleared
    with a null, written once: the next pass finds the key gone and omits it.
    """
    wanted = (body.get("spec") or {}).get("imageRebuildTriggerGeneration")
    if wanted is not None:
        return {"imageRebuildTriggerGeneration": wanted}
    if "imageRebuildTriggerGeneration" in (body.get("status") or {}):
        return {"imageRebuildTriggerGeneration": None}
    return {}
