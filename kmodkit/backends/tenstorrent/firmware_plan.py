"""The firmware policy's plan: its rollout and its status.

Pure: flash Jobs are made by the rollout's swap (one per node and attempt), so
the plan owns no objects; it decides which nodes the rollout covers, what it
delivers, and reports each node from its rollout state and the version it
carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kmodkit.backends.tenstorrent import names
from kmodkit.backends.tenstorrent.drain_rules import firmware_policy
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.firmware_hooks import FirmwareHooks, FirmwareTarget
from kmodkit.backends.tenstorrent.flash_pods import image_pull_problems
from kmodkit.backends.tenstorrent.keys import TT_FIRMWARE_SKIP_LABEL, TT_FW_VERSION_LABEL
from kmodkit.backends.tenstorrent.node_owners import (
    CONFLICT_REASON,
    CONFLICT_STATE,
    FIRST_SIGHT_REASONS,
    claims,
    conflict_message,
    labels_read,
    owners,
)
from kmodkit.backends.tenstorrent.selection import NodeLabelSelector, covers
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.backends.tenstorrent.spec_errors import invalid_spec_plan
from kmodkit.backends.tenstorrent.status_common import (
    Row,
    condition,
    count,
    node_entries,
    overlay_rollout,
    paused_progressing,
    paused_ready,
    transition_events,
)
from kmodkit.backends.tenstorrent.unknown_fields import ignored_condition, parse_spec
from kmodkit.sdk import (
    ClusterView,
    NodeView,
    Obj,
    Plan,
    RolloutKeys,
    RolloutRequest,
    RolloutStatus,
    State,
    parse_state,
)

REQUEUE_WHILE_ROLLING = 5.0
FLASHERS = "flashers"
"""The ``ClusterView.watched`` key of the flash pods."""
POLICIES = "firmwarepolicies"
"""The ``ClusterView.watched`` key of all firmware policies (who owns a shared node)."""
FLASH_JOBS = "flashjobs"
"""The ``ClusterView.watched`` key of the flash Jobs, which the hooks read each pass."""

ROLLOUT_STATES: Mapping[State, str] = {
    State.REQUIRED: "Pending",
    State.CORDONING: "Cordoning",
    State.GATING: "Draining",
    State.WAITING_FOR_JOBS: "Draining",
    State.EVICTING: "Draining",
    State.DRAINING: "Draining",
    State.SWAPPING: "Flashing",
    State.VALIDATING: "Flashing",
    State.UNCORDONING: "Uncordoning",
    State.DONE: "Done",
    State.FAILED: "Failed",
}
_FLASHED = frozenset({State.SWAPPING, State.VALIDATING, State.UNCORDONING, State.DONE})
"""Rollout states in which the node's flash Job of this version exists (or did)."""
_REASONS = {
    "Pending": "WaitingForSlot",
    "Cordoning": "Cordoning",
    "Draining": "Draining",
    "Flashing": "Flashing",
    "Uncordoning": "Uncordoning",
    "Done": "FlashSucceeded",
    "Failed": "RolloutFailed",
}


OBSERVED_REASONS: Mapping[str, bool] = {
    "FlasherImagePullFailed": True,
    "Skipped": False,
    "AutoUpgradeDisabled": False,
    CONFLICT_REASON: True,
}
"""Node reasons read from the node and its flash pod (not rollout moves), each with whether
its Event is a warning."""


NO_FORCE_REQUEST = 0
"""``status.forceWriteRequest`` while forceWrite is off (generations start at 1)."""


def force_request(spec: TenstorrentFirmwarePolicySpec, body: Obj) -> int | None:
    """The forceWrite request in force: the generation at which forceWrite was switched on,
    kept in the status while it stays on, so other spec edits do not flash again."""
    if not spec.flasher.force_write:
        return None
    previous = (body.get("status") or {}).get("forceWriteRequest")
    if isinstance(previous, int) and previous != NO_FORCE_REQUEST:
        return previous
    generation = (body.get("metadata") or {}).get("generation")
    return int(generation) if isinstance(generation, int) else 0


def _target(name: str, spec: TenstorrentFirmwarePolicySpec, body: Obj) -> FirmwareTarget:
    return FirmwareTarget(
        policy=name,
        readback=spec.readback(),
        auto_upgrade=spec.upgrade_policy.auto_upgrade,
        force_request=force_request(spec, body),
    )


def _row(
    node: NodeView,
    spec: TenstorrentFirmwarePolicySpec,
    policy: str,
    keys: RolloutKeys,
    pull_problem: str = "",
) -> Row:
    current = node.labels.get(TT_FW_VERSION_LABEL, "")
    job = names.flash_job_name(policy, node.name, spec.version)
    if node.labels.get(TT_FIRMWARE_SKIP_LABEL) == "true":
        return Row(
            node.name,
            "Skipped",
            "Skipped",
            f"the node carries {TT_FIRMWARE_SKIP_LABEL}=true",
            current,
        )
    rollout = parse_state(node.labels.get(keys.state))
    if rollout is not None:
        state = ROLLOUT_STATES[rollout]
        extra = {"lastFlashJob": job} if rollout in _FLASHED else {}
        if state == "Flashing" and pull_problem:
            message = (
                f"kubelet: {pull_problem} (check the flasher image and the imagePullSecrets of "
                "the flash pods' service account); the node fails at the flash deadline"
            )
            return Row(node.name, state, "FlasherImagePullFailed", message, current, extra, rollout)
        return Row(node.name, state, _REASONS[state], "", current, extra, rollout)
    if current == spec.readback():
        return Row(node.name, "Done", "FlashSucceeded", "", current)
    if not spec.upgrade_policy.auto_upgrade:
        return Row(
            node.name,
            "Pending",
            "AutoUpgradeDisabled",
            "spec.upgradePolicy.autoUpgrade is false; reporting the drift only",
            current,
        )
    return Row(node.name, "Pending", "UpgradeRequired", "", current)


def _conditions(
    rows: Sequence[Row],
    spec: TenstorrentFirmwarePolicySpec,
    previous: Mapping[str, Any],
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    managed = [r for r in rows if r.state not in ("Skipped", CONFLICT_STATE)]
    done, failed = count(managed, "Done"), count(managed, "Failed")
    busy = count(managed, "Pending", "Cordoning", "Draining", "Flashing", "Uncordoning")
    if failed:
        ready = ("False", "NodesFailed", f"{failed} node(s) failed")
    elif busy and spec.paused:
        ready = paused_ready(done, len(managed))
    elif busy:
        ready = ("False", "NodesPending", f"{done}/{len(managed)} up to date")
    else:
        ready = ("True", "AllUpToDate", "all matched nodes run the desired firmware")
    in_flight = count(managed, "Cordoning", "Draining", "Flashing", "Uncordoning")
    halted = spec.upgrade_policy.halt_on_failure and any(
        r.rollout_state is State.FAILED for r in managed
    )
    if spec.paused:
        progressing = paused_progressing(in_flight)
    elif halted and not in_flight:
        progressing = ("False", "Halted", "a node failed and haltOnFailure is set")
    elif in_flight or (busy and spec.upgrade_policy.auto_upgrade and not spec.paused):
        progressing = ("True", "NodesUpgrading", f"{in_flight} node(s) in progress")
    else:
        progressing = ("False", "Idle", "nothing to flash")
    return [
        condition(previous, "Ready", *ready, generation, now),
        condition(previous, "Progressing", *progressing, generation, now),
    ]


def _selector_of(body: Obj) -> NodeLabelSelector | None:
    try:
        spec, _ = parse_spec(TenstorrentFirmwarePolicySpec, body.get("spec") or {})
    except ValidationError:
        return None  # an invalid policy is refused and claims no node
    return spec.selector()


def node_labels(body: Obj, watched: Mapping[str, Sequence[Obj]]) -> Callable[[str], bool]:
    """The node labels a firmware policy's passes read (``labels_read``)."""
    return labels_read([body, *watched.get(POLICIES, ())], _selector_of)


def node_owners(body: Obj, view: ClusterView, require_pci: bool) -> Mapping[str, str]:
    """The owner of each node any firmware policy covers; this policy's own body counts
    even before the watch has seen it."""
    name = (body.get("metadata") or {}).get("name")
    others = [
        p for p in view.watched.get(POLICIES, ()) if (p.get("metadata") or {}).get("name") != name
    ]
    return owners(claims([*others, body], _selector_of), view.nodes, require_pci)


def _conflict_row(node: NodeView, winner: str) -> Row:
    return Row(
        node.name,
        CONFLICT_STATE,
        CONFLICT_REASON,
        conflict_message(winner, "firmware policy"),
        node.labels.get(TT_FW_VERSION_LABEL, ""),
    )


def plan_at(body: Obj, view: ClusterView, now: datetime) -> Plan:
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    generation = meta.get("generation")
    previous = body.get("status") or {}
    try:
        spec, unknown = parse_spec(TenstorrentFirmwarePolicySpec, body.get("spec") or {})
    except ValidationError as err:
        return invalid_spec_plan(err, view, previous, generation, now)
    settings = TenstorrentSettings.from_settings(view.settings)
    policy_id = names.firmware_policy_id(name)
    keys = RolloutKeys.for_policy(policy_id)
    selector = spec.selector()
    matched = [n for n in view.nodes if covers(selector, n.labels, settings.require_pci_label)]
    owner = node_owners(body, view, settings.require_pci_label)
    covered = [n for n in matched if owner.get(n.name) == name]
    pulls = image_pull_problems(view.watched.get(FLASHERS, ()), name)
    rows = [
        _row(n, spec, name, keys, pulls.get(n.name, ""))
        if owner.get(n.name) == name
        else _conflict_row(n, owner.get(n.name, ""))
        for n in matched
    ]
    entries, omitted = node_entries(rows, previous, now)
    request = force_request(spec, body)
    status = {
        "observedGeneration": generation,
        "desiredVersion": spec.version,
        "summary": {
            "matched": len(rows),
            "upToDate": count(rows, "Done"),
            "inProgress": count(rows, "Cordoning", "Draining", "Flashing", "Uncordoning"),
            "failed": count(rows, "Failed"),
            "pending": count(rows, "Pending"),
            "skipped": count(rows, "Skipped"),
            "conflicts": count(rows, CONFLICT_STATE),
        },
        "nodes": entries,
        "nodesOmitted": omitted,
        "conditions": [
            *_conditions(rows, spec, previous, generation, now),
            *ignored_condition(unknown, previous, generation, now),
        ],
        "forceWriteRequest": NO_FORCE_REQUEST if request is None else request,
    }
    busy = any(r.state not in ("Done", "Skipped", CONFLICT_STATE) for r in rows)
    return Plan(
        status=status,
        events=transition_events(
            rows, previous, OBSERVED_REASONS, announce_new=FIRST_SIGHT_REASONS
        ),
        requeue_after=REQUEUE_WHILE_ROLLING if busy else None,
        rollout=RolloutRequest(
            policy_id=policy_id,
            policy=firmware_policy(spec.upgrade_policy, settings),
            nodes=[n.name for n in covered],
            target=spec.version + (f"/force-{request}" if request is not None else ""),
            paused=spec.paused,
            skip_label=TT_FIRMWARE_SKIP_LABEL,
        ),
    )


def plan(body: Obj, view: ClusterView) -> Plan:
    return plan_at(body, view, datetime.now(UTC))


def hooks(body: Obj, view: ClusterView, api: Any) -> FirmwareHooks:
    name = str((body.get("metadata") or {}).get("name", ""))
    spec, _ = parse_spec(TenstorrentFirmwarePolicySpec, body.get("spec") or {})
    namespace = view.operator_namespace
    jobs = {
        str(meta.get("name")): job
        for job in view.watched.get(FLASH_JOBS, ())
        if (meta := job.get("metadata") or {}).get("namespace") == namespace
    }
    return FirmwareHooks(
        api,
        body,
        spec,
        TenstorrentSettings.from_settings(view.settings),
        namespace,
        _target(name, spec, body),
        jobs,
    )


def rollout_status(status: Mapping[str, Any], result: RolloutStatus) -> Mapping[str, Any]:
    return overlay_rollout(status, result, ROLLOUT_STATES)
