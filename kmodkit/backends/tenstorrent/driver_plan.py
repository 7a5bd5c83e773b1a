"""The driver policy's plan: its builder DaemonSet, its rollout and its status.

Pure: from the policy object and what the runtime observed (nodes, builder
pods) to the objects to own, the rollout to run and the status. The clock is
an argument so the plan can be tested at any instant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kmodkit.backends.tenstorrent import driver_owners, keys, names
from kmodkit.backends.tenstorrent.builder_pods import BuilderPod, pods_by_node
from kmodkit.backends.tenstorrent.drain_rules import driver_policy
from kmodkit.backends.tenstorrent.driver_api import TenstorrentDriverPolicySpec
from kmodkit.backends.tenstorrent.driver_changes import (
    DriverTarget,
    builders_to_restart,
    is_outdated,
    is_standing_by,
    needs_reload,
)
from kmodkit.backends.tenstorrent.driver_daemonset import control_map, daemonset
from kmodkit.backends.tenstorrent.driver_hooks import DriverHooks
from kmodkit.backends.tenstorrent.driver_owners import (
    Ownership,
    ordered_claims,
    ownership,
    too_complex_message,
)
from kmodkit.backends.tenstorrent.node_owners import (
    CONFLICT_REASON,
    CONFLICT_STATE,
    FIRST_SIGHT_REASONS,
    conflict_message,
    owners,
)
from kmodkit.backends.tenstorrent.selection import covers
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.backends.tenstorrent.spec_errors import invalid_spec_plan
from kmodkit.backends.tenstorrent.status_common import (
    IN_PROGRESS,
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

BUILDERS = driver_owners.BUILDERS
"""The ``ClusterView.watched`` key of the builder pods."""
POLICIES = driver_owners.POLICIES
BUILDER_SETS = driver_owners.BUILDER_SETS
REQUEUE_WHILE_ROLLING = 5.0

ROLLOUT_STATES: Mapping[State, str] = {
    State.REQUIRED: "Pending",
    State.CORDONING: "Cordoning",
    State.GATING: "Draining",
    State.WAITING_FOR_JOBS: "Draining",
    State.EVICTING: "Draining",
    State.DRAINING: "Draining",
    State.SWAPPING: "Upgrading",
    State.VALIDATING: "Upgrading",
    State.UNCORDONING: "Uncordoning",
    State.FAILED: "Failed",
}
"""Driver node state shown for each rollout state (``done`` is shown from the builder)."""
OBSERVED_REASONS: Mapping[str, bool] = {
    "BuilderImagePullFailed": True,
    "BuilderCrashLoop": True,
    "HostManagedKMD": False,
    "Skipped": False,
    CONFLICT_REASON: True,
}
"""Node reasons read from the node and its builder pod (not rollout moves), each with whether
its Event is a warning."""


@dataclass(frozen=True)
class _Context:
    spec: TenstorrentDriverPolicySpec
    target: DriverTarget
    keys: RolloutKeys
    paused_without_builders: bool


def _target(spec: TenstorrentDriverPolicySpec, ds: Mapping[str, Any]) -> DriverTarget:
    return DriverTarget(
        version=spec.version,
        template_hash=ds["metadata"]["annotations"][keys.TT_TEMPLATE_HASH_ANNOTATION],
        force_unload=spec.upgrade_policy.force_unload,
        drain=spec.upgrade_policy.drain.enable,
    )


def _row(node: NodeView, pod: BuilderPod | None, ctx: _Context, held: str = "") -> Row:
    version = ctx.spec.version
    loaded = node.labels.get(keys.TT_KMD_VERSION_LABEL, "")

    def row(state: str, reason: str = "", message: str = "", rollout: State | None = None) -> Row:
        return Row(node.name, state, reason, message, loaded, rollout_state=rollout)

    rollout = parse_state(node.labels.get(ctx.keys.state))
    if node.labels.get(keys.TT_DRIVER_SKIP_LABEL) == "true":
        return row("Skipped", "Skipped", f"the node carries {keys.TT_DRIVER_SKIP_LABEL}=true")
    if node.labels.get(keys.TT_INSTALL_MODE_LABEL) == "host":
        return row(
            "HostManaged",
            "HostManagedKMD",
            "DKMS manages tt-kmd on this node; the operator stands by "
            "(vacate DKMS to hand the node over)",
        )
    if rollout in (None, State.DONE) and is_standing_by(node.labels, pod):
        return row(
            "Pending",
            "TakeoverRequired",
            "DKMS is gone; the node is taken over through the rollout "
            "(cordon, drain, then its builder is replaced)",
        )
    if pod is not None and pod.image_pull_problem:
        return row(
            "Failed",
            "BuilderImagePullFailed",
            f"kubelet: {pod.image_pull_problem} (check the image and the installer service "
            "account's imagePullSecrets)",
            rollout,
        )
    if pod is not None and pod.crash_loop:
        return row(
            "Failed",
            "BuilderCrashLoop",
            pod.last_error or "the builder keeps failing; see its log",
            rollout,
        )
    if rollout is not None and rollout in ROLLOUT_STATES:
        state = ROLLOUT_STATES[rollout]
        reason = {
            "Pending": "WaitingForSlot",
            "Cordoning": "Cordoning",
            "Draining": "Draining",
            "Upgrading": "Installing",
            "Uncordoning": "Uncordoning",
            "Failed": "RolloutFailed",
        }[state]
        return row(state, reason, rollout=rollout)
    if pod is None:
        if held:
            return row("Pending", "WaitingForHandover", held)
        if ctx.paused_without_builders:
            return row("Pending", "Paused", "spec.paused is true; no builder runs yet")
        return row("Pending", "WaitingForBuilder", "waiting for the builder pod")
    if needs_reload(node.labels, ctx.target):
        return row(
            "Pending",
            "UpgradeRequired",
            f"tt-kmd {loaded} is loaded; the rollout reloads it with {version}",
        )
    if pod.ready and loaded == version:
        if is_outdated(pod, ctx.target):
            return row(
                "Pending",
                "BuilderRestartPending",
                f"tt-kmd {version} stays loaded; the builder is restarted from the new template",
            )
        return row("Done", "Ready", rollout=rollout)
    return row("Upgrading", "Installing", f"builder is building and loading tt-kmd {version}")


def _conflict_row(node: NodeView, winner: str) -> Row:
    return Row(
        node.name,
        CONFLICT_STATE,
        CONFLICT_REASON,
        conflict_message(winner, "driver policy"),
        node.labels.get(keys.TT_KMD_VERSION_LABEL, ""),
    )


def _conditions(
    rows: Sequence[Row], ctx: _Context, previous: Mapping[str, Any], gen: int | None, now: datetime
) -> list[dict[str, Any]]:
    managed = [r for r in rows if r.state not in ("Skipped", "HostManaged", CONFLICT_STATE)]
    done = count(managed, "Done")
    failed = count(managed, "Failed")
    halted = ctx.spec.upgrade_policy.halt_on_failure and any(
        r.rollout_state is State.FAILED for r in managed
    )
    if not rows:
        ready = ("True", "NoMatchingNodes", "no node matches the policy")
    elif done == len(managed):
        ready = (
            "True",
            "AllReady",
            f"{done}/{len(managed)} nodes have tt-kmd {ctx.spec.version}"
            + _conflicts_note(count(rows, CONFLICT_STATE)),
        )
    elif failed:
        ready = ("False", "NodesFailed", f"{failed} node(s) failed; see status.nodes")
    elif ctx.spec.paused:
        ready = paused_ready(done, len(managed))
    else:
        ready = ("False", "Installing", f"{done}/{len(managed)} nodes ready")
    if ctx.spec.paused:
        progressing = paused_progressing(count(managed, *IN_PROGRESS))
    elif halted:
        progressing = ("False", "Halted", "a node failed and haltOnFailure is set")
    elif done + failed < len(managed):
        progressing = ("True", "Rolling", f"{done}/{len(managed)} nodes ready")
    else:
        progressing = ("False", "Idle", "nothing to roll")
    return [
        condition(previous, "Ready", *ready, gen, now),
        condition(previous, "Progressing", *progressing, gen, now),
    ]


def _conflicts_note(conflicts: int) -> str:
    if not conflicts:
        return ""
    return f"; {conflicts} more node(s) belong to older driver policies (state Conflict)"


def _degraded(
    own: Ownership, previous: Mapping[str, Any], generation: int | None, now: datetime
) -> list[dict[str, Any]]:
    """Degraded while the overlap is too complex to keep out by labels."""
    if not own.too_complex:
        return []
    message = too_complex_message(own.too_complex)
    return [condition(previous, "Degraded", "True", "OverlapTooComplex", message, generation, now)]


def _starts(owned: Sequence[NodeView], held: Mapping[str, str], state_key: str) -> list[str]:
    """The nodes the rollout may work on: the owned ones, but not those whose builder of the
    previous owner is still there (unless this policy's rollout already holds the node)."""
    return [
        n.name
        for n in owned
        if n.name not in held or parse_state(n.labels.get(state_key)) not in (None, State.DONE)
    ]


def plan_at(body: Obj, view: ClusterView, now: datetime) -> Plan:
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    generation = meta.get("generation")
    previous = body.get("status") or {}
    try:
        spec, unknown = parse_spec(TenstorrentDriverPolicySpec, body.get("spec") or {})
    except ValidationError as err:
        return invalid_spec_plan(err, view, previous, generation, now)
    settings = TenstorrentSettings.from_settings(view.settings)
    owned_ds = [o for o in view.owned if o.get("kind") == "DaemonSet"]
    own = ownership(body, view, keys.TT_DRIVER_SKIP_LABEL, settings.require_pci_label)
    ds = daemonset(name, view.operator_namespace, spec, settings, own.terms)
    target = _target(spec, ds)
    # A paused policy starts no builder: an admin migrating from DKMS applies the
    # policy paused and unpauses once the node is vacated.
    create = bool(owned_ds) or not spec.paused
    policy_id = names.driver_policy_id(name)
    ctx = _Context(spec, target, RolloutKeys.for_policy(policy_id), not create)
    selector = spec.selector()
    covered = [n for n in view.nodes if covers(selector, n.labels, settings.require_pci_label)]
    owned = [n for n in covered if own.owner.get(n.name) == name]
    pods = pods_by_node(view.watched.get(BUILDERS, ()), name)
    rows = [
        _row(n, pods.get(n.name), ctx, own.held.get(n.name, ""))
        if own.owner.get(n.name) == name
        else _conflict_row(n, own.owner.get(n.name, ""))
        for n in covered
    ]
    entries, omitted = node_entries(rows, previous, now)
    managed = [r for r in rows if r.state not in ("Skipped", "HostManaged", CONFLICT_STATE)]
    status = {
        "observedGeneration": generation,
        "desiredVersion": spec.version,
        "daemonSet": ds["metadata"]["name"] if create else "",
        "summary": {
            "matched": len(rows),
            "ready": sum(
                1
                for r in managed
                if (p := pods.get(r.name)) is not None
                and p.ready
                and r.current_version == spec.version
            ),
            "upToDate": count(rows, "Done", "HostManaged"),
            "inProgress": count(rows, "Cordoning", "Draining", "Upgrading", "Uncordoning"),
            "failed": count(rows, "Failed"),
            "pending": count(rows, "Pending"),
            "hostManaged": count(rows, "HostManaged"),
            "skipped": count(rows, "Skipped"),
            "conflicts": count(rows, CONFLICT_STATE),
        },
        "nodes": entries,
        "nodesOmitted": omitted,
        "conditions": [
            *_conditions(rows, ctx, previous, generation, now),
            *_degraded(own, previous, generation, now),
            *ignored_condition(unknown, previous, generation, now),
        ],
    }
    busy = any(r.state not in ("Done", "HostManaged", "Skipped", CONFLICT_STATE) for r in rows)
    return Plan(
        objects=[ds, control_map(name, view.operator_namespace, spec.paused)] if create else [],
        status=status,
        events=transition_events(
            rows, previous, OBSERVED_REASONS, announce_new=FIRST_SIGHT_REASONS
        ),
        requeue_after=REQUEUE_WHILE_ROLLING if busy else None,
        rollout=RolloutRequest(
            policy_id=policy_id,
            policy=driver_policy(spec.upgrade_policy, settings, view.operator_namespace),
            nodes=_starts(owned, own.held, ctx.keys.state),
            target=f"{spec.version}/{target.template_hash}"
            + ("/force-unload" if target.force_unload else ""),
            paused=spec.paused,
            skip_label=keys.TT_DRIVER_SKIP_LABEL,
        ),
    )


def plan(body: Obj, view: ClusterView) -> Plan:
    return plan_at(body, view, datetime.now(UTC))


def hooks(body: Obj, view: ClusterView, api: Any) -> DriverHooks:
    """The rollout's hooks for this pass, after this pass's builder restarts."""
    name = str((body.get("metadata") or {}).get("name", ""))
    spec, _ = parse_spec(TenstorrentDriverPolicySpec, body.get("spec") or {})
    settings = TenstorrentSettings.from_settings(view.settings)
    target = _target(spec, daemonset(name, view.operator_namespace, spec, settings))
    pods = pods_by_node(view.watched.get(BUILDERS, ()), name)
    driver_hooks = DriverHooks(api, pods, target)
    if not spec.paused:
        # Changes that need no reload are not the rollout's: they are rolled here, on every
        # pass, from what the pods show (so an operator restart carries on where it was).
        selector = spec.selector()
        owner = owners(ordered_claims(body, view), view.nodes, settings.require_pci_label)
        covered = [
            n
            for n in view.nodes
            if covers(selector, n.labels, settings.require_pci_label) and owner.get(n.name) == name
        ]
        state_key = RolloutKeys.for_policy(names.driver_policy_id(name)).state
        policy = driver_policy(spec.upgrade_policy, settings, view.operator_namespace)
        driver_hooks.restart(
            builders_to_restart(covered, pods, target, state_key, policy.max_parallel)
        )
    return driver_hooks


def rollout_status(status: Mapping[str, Any], result: RolloutStatus) -> Mapping[str, Any]:
    return overlay_rollout(status, result, ROLLOUT_STATES)
