"""What each verb changes, decided from the object it reads (pure).

Every verb turns into an ``Edit``: the merge patch of exactly the fields it
changes, one ``Change`` line per field for the user, or, when the object is
already as asked, no patch and a sentence saying so. Refusals (a kind with no
pause, a node that is not failed) are ``click.ClickException``s naming the object
and what to do instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from kmodkit.core import labels
from kmodkit.core.api.common import LABEL_VALUE_RE
from kmodkit.core.cli.kubectl.kinds import Kind
from kmodkit.core.rollout.keys import ROLLOUT_PREFIX, RolloutKeys
from kmodkit.core.rollout.states import IN_FLIGHT, State


@dataclass(frozen=True)
class Change:
    obj: str
    """``node/n1``, ``ttdp/default``."""
    field: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        return f"{self.obj}: {self.field}: {_shown(self.old)} -> {_shown(self.new)}"


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else (value or '""')


@dataclass(frozen=True)
class Edit:
    body: dict[str, Any] | None
    """The merge patch; None when nothing changes."""
    changes: tuple[Change, ...] = ()
    already: str = ""
    """Said when nothing changes."""
    notes: tuple[str, ...] = ()
    """What the user should know about the change (it waits for something else, say)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def ref_of(kind: Kind, obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{kind.short}/{ns}{meta.get('name')}"


def pause(kind: Kind, obj: Mapping[str, Any], paused: bool, pausable: Sequence[Kind]) -> Edit:
    """Set the kind's pause field of ``obj`` to ``paused``."""
    where = ref_of(kind, obj)
    field = kind.controls.pause_field if kind.controls else None
    if field is None:
        others = ", ".join(k.crd.kind for k in pausable) or "none installed"
        raise click.ClickException(
            f"{where}: a {kind.crd.kind} cannot be paused, it has no pause switch "
            f"(kinds that have one: {others})"
        )
    old = (obj.get("spec") or {}).get(field) is True
    if old == paused:
        return Edit(None, already=f"{where} is already {'paused' if paused else 'running'}")
    change = Change(where, f"spec.{field}", str(old).lower(), str(paused).lower())
    return Edit({"spec": {field: paused}}, (change,))


def skip(node: Mapping[str, Any], skip_labels: Sequence[str], on: bool) -> Edit:
    """Set (or remove) the skip labels on ``node``."""
    name = str(_meta(node).get("name"))
    current = _meta(node).get("labels") or {}
    want = "true" if on else None
    changes = tuple(
        Change(f"node/{name}", f"label {key}", current.get(key), want)
        for key in skip_labels
        if current.get(key) != want
    )
    if not changes:
        what = "skipped by" if on else "not skipped by"
        return Edit(None, already=f"node/{name} is already {what} {', '.join(skip_labels)}")
    body = {"metadata": {"labels": {c.field.removeprefix("label "): want for c in changes}}}
    return Edit(body, changes)


def _rollout_states(node: Mapping[str, Any]) -> dict[str, str]:
    """The node's rollout state labels (``rollout.kmodkit.io/<scope>``), by key."""
    prefix = f"{ROLLOUT_PREFIX}/"
    return {k: v for k, v in (_meta(node).get("labels") or {}).items() if k.startswith(prefix)}


def _not_failed(name: str, key: str, state: str) -> str:
    scope = key.removeprefix(f"{ROLLOUT_PREFIX}/")
    if state in IN_FLIGHT:
        hint = "it is moving; wait until it is done or failed"
    elif state == State.REQUIRED:
        hint = "it waits for room in the budgets (kubectl kmodkit status shows what blocks it)"
    else:
        hint = "nothing to retry"
    return f"node/{name} is {state} in rollout {scope}, not failed: {hint}"


def retry(node: Mapping[str, Any], policy_id: str | None) -> Edit:
    """Clear the failed state of ``node`` in rollout ``policy_id`` (every failed one when None).

    Only the state label goes: the annotations remember the cordon and the gate
    values the rollout made, so the next pass undoes exactly those (docs/rollout.md).
    The patch carries the node's resourceVersion, so a node that moved on since it
    was read is not cleared.
    """
    meta = _meta(node)
    name = str(meta.get("name"))
    states = _rollout_states(node)
    if policy_id is not None:
        key = RolloutKeys.for_policy(policy_id).state
        states = {key: states[key]} if key in states else {}
        if not states:
            return Edit(None, already=f"node/{name} is already idle in rollout {policy_id}")
    elif not states:
        return Edit(None, already=f"node/{name} is already idle in every rollout")
    failed = {k: v for k, v in states.items() if v == State.FAILED}
    if not failed:
        refusals = "; ".join(_not_failed(name, k, v) for k, v in sorted(states.items()))
        raise click.ClickException(refusals)
    changes = tuple(
        Change(f"node/{name}", f"label {k}", v, None) for k, v in sorted(failed.items())
    )
    body = {
        "metadata": {
            "labels": dict.fromkeys(failed),
            "resourceVersion": str(meta.get("resourceVersion", "")),
        }
    }
    return Edit(body, changes)


def upgrade(node: Mapping[str, Any], module: Mapping[str, Any], version: str) -> Edit:
    """Label ``node`` to run ``version`` of ``module`` (KMM's ordered upgrade)."""
    meta = _meta(module)
    ns, mod = str(meta.get("namespace")), str(meta.get("name"))
    if not version or not re.fullmatch(LABEL_VALUE_RE, version):
        raise click.UsageError(
            f"--version {version!r} is not a label value: at most 63 letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    try:
        key = labels.MODULE_VERSION.key(ns, mod)
    except labels.LabelKeyError as e:
        raise click.ClickException(str(e)) from e
    name = str(_meta(node).get("name"))
    old = (_meta(node).get("labels") or {}).get(key)
    container = ((module.get("spec") or {}).get("moduleLoader") or {}).get("container") or {}
    wanted = container.get("version")
    notes: tuple[str, ...] = ()
    if not wanted:
        notes = (
            f"Module {ns}/{mod} sets no spec.moduleLoader.container.version, so its nodes "
            "load it whatever this label says; ordered upgrades start once it sets one",
        )
    elif wanted != version:
        notes = (
            f"Module {ns}/{mod} is at version {wanted}: node/{name} keeps what it runs "
            f"until the Module's version is {version}",
        )
    if old == version:
        return Edit(None, already=f"node/{name}: label {key} is already {version}", notes=notes)
    change = Change(f"node/{name}", f"label {key}", old, version)
    return Edit({"metadata": {"labels": {key: version}}}, (change,), notes=notes)
