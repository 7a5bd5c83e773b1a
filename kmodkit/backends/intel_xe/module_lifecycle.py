"""What happens to the policy's Module on this pass: apply, hold, remove, recreate or
hand over to the other engine.

Pure and stateless: every decision is read from the desired Module and the
Modules the policy owns right now, so a restarted operator carries on where
the last one stopped.

- KMM refuses to switch ``version`` between empty and set on a live Module:
  that is done by deleting the Module and creating it again once it is gone
  (``Recreating``); a version bump with both set is applied in place.
- A switch of engine runs both engines' Modules until the new one serves every
  node, then lets the old one go without a moment unserved (``_switch``).
- Removing ``kernelModule`` deletes the Module (``Removing``), and the engine
  unloads the driver.
- While a GPU ResourceClaim is allocated, a Module that would be deleted is
  held as it is: pulling the driver out from under running workloads is what
  the guard prevents. The policy says which claims block it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kmodkit.backends.intel_xe.engine import API_VERSIONS
from kmodkit.sdk import HANDED_OVER, MODULE_VERSION_LABEL, LabelKeyError, Obj

RECHECK_SECONDS = 5.0
"""Safety-net re-run while a Module is going away (its deletion event normally wakes us)."""
_ENGINE_NAMES = {v: k for k, v in API_VERSIONS.items()}


@dataclass(frozen=True)
class ModuleOutcome:
    objects: list[dict[str, Any]] = field(default_factory=list)
    kmm_status: str = "N/A"
    errors: list[str] = field(default_factory=list)
    requeue_after: float | None = None
    serving: str | None = None
    """The engine whose Module is applied or held this pass."""
    switch: str | None = None
    """Where a switch between engines stands, while one is under way."""
    observed: bool = True
    """False while the applied Module has no status from its engine yet (its ``0/0`` then
    counts nothing)."""


def reference(module: Mapping[str, Any]) -> str:
    """``modules.<group>/<name>``, how the policy's messages name a Module."""
    group = str(module.get("apiVersion", "")).split("/")[0]
    return f"modules.{group}/{(module.get('metadata') or {}).get('name', '')}"


def live_modules(owned: Sequence[Obj]) -> list[Obj]:
    return [o for o in owned if o.get("kind") == "Module" and o.get("apiVersion") in _ENGINE_NAMES]


def held(live: Obj) -> dict[str, Any]:
    """A manifest that keeps ``live`` as it is (its content, not the server's bookkeeping)."""
    meta = live.get("metadata") or {}
    kept = {"name": meta.get("name")}
    if meta.get("namespace"):
        kept["namespace"] = meta["namespace"]
    if meta.get("labels"):
        kept["labels"] = dict(meta["labels"])
    content = {k: v for k, v in live.items() if k not in ("metadata", "status")}
    return {**content, "metadata": kept}


def _deleting(module: Obj) -> bool:
    return bool((module.get("metadata") or {}).get("deletionTimestamp"))


def _version(module: Mapping[str, Any]) -> str:
    spec = module.get("spec") or {}
    return str(((spec.get("moduleLoader") or {}).get("container") or {}).get("version") or "")


def _counts(module: Obj | None) -> tuple[int, int]:
    loader = ((module or {}).get("status") or {}).get("moduleLoader") or {}
    return int(loader.get("availableNumber") or 0), int(loader.get("desiredNumber") or 0)


def _applied(desired: dict[str, Any], live: Obj | None) -> ModuleOutcome:
    available, wanted = _counts(live)
    errors = []
    if wanted > 0 and available < wanted:
        errors.append(
            f"module loader not fully available ({available}/{wanted}) for {reference(desired)}"
        )
    elif wanted == 0 and (version := _version(desired)) and _matching(live) > 0:
        errors.append(_awaiting_labels(desired, version))
    return ModuleOutcome(
        [desired],
        _column(live),
        errors,
        serving=_ENGINE_NAMES[desired["apiVersion"]],
        observed="moduleLoader" in ((live or {}).get("status") or {}),
    )


def _matching(module: Obj | None) -> int:
    loader = ((module or {}).get("status") or {}).get("moduleLoader") or {}
    return int(loader.get("nodesMatchingSelectorNumber") or 0)


def _awaiting_labels(module: Mapping[str, Any], version: str) -> str:
    """What an admin does next in an ordered upgrade that no node has joined yet."""
    meta = module.get("metadata") or {}
    try:
        key = MODULE_VERSION_LABEL.key(meta.get("namespace", ""), meta.get("name", ""))
    except LabelKeyError as err:
        return str(err)
    return (
        f"no node is labelled for version {version} of {reference(module)} yet; "
        f"label the nodes to move to it: kubectl label node <node> {key}={version}"
    )


def _hold(alive: list[Obj], errors: list[str]) -> ModuleOutcome:
    return ModuleOutcome(
        [held(m) for m in alive],
        _column(alive[0]),
        errors,
        serving=_ENGINE_NAMES[alive[0]["apiVersion"]],
    )


def _pending(live: list[Obj]) -> list[str]:
    return [f"{reference(m)} is pending deletion" for m in live if _deleting(m)]


def decide(
    desired: dict[str, Any] | None,
    owned: Sequence[Obj],
    claims: Sequence[str],
    hold_reason: str | None = None,
) -> ModuleOutcome:
    """The Module outcome of this pass.

    ``desired`` is None when the policy has no kernelModule, or when it
    cannot be served now; ``hold_reason`` then says why, and a live Module
    is kept rather than deleted.
    """
    live = live_modules(owned)
    alive = [m for m in live if not _deleting(m)]
    if desired is None:
        if hold_reason is not None:
            return _hold(alive, [hold_reason]) if alive else ModuleOutcome(errors=[hold_reason])
        if not live:
            return ModuleOutcome()
        if claims and alive:
            return _hold(alive, [_blocked(m, "deletion") for m in alive])
        return ModuleOutcome([], "Removing", _pending(live), RECHECK_SECONDS)

    same = next((m for m in live if m.get("apiVersion") == desired["apiVersion"]), None)
    others = [m for m in live if m is not same]
    toggled = (
        same is not None and not _deleting(same) and bool(_version(same)) != bool(_version(desired))
    )
    if not toggled and not others and (same is None or not _deleting(same)):
        return _applied(desired, same)
    if not toggled and others and (same is None or not _deleting(same)):
        return _switch(desired, same, others, claims)
    if claims and alive:
        engine = _ENGINE_NAMES[desired["apiVersion"]]
        why = "recreation for version change" if toggled else f"deletion for the switch to {engine}"
        return _hold(alive, [_blocked(m, why) for m in alive])
    return ModuleOutcome([], "Recreating", _pending(live), RECHECK_SECONDS)


def _serving(module: Obj | None) -> bool:
    """Whether an engine has loaded the driver on every node its Module targets: only
    then may the other engine's Module go (an installed CRD is not a running KMM)."""
    available, wanted = _counts(module)
    return (wanted > 0 and available == wanted) or (
        module is not None and "status" in module and wanted == 0 and _matching(module) == 0
    )


def _switch(
    desired: dict[str, Any], same: Obj | None, others: list[Obj], claims: Sequence[str]
) -> ModuleOutcome:
    """From one engine to the other without a moment in which neither serves.

    Both Modules run side by side (the same driver, the same readiness labels:
    the new engine adopts what is loaded) until the new one reports the driver
    loaded everywhere. Then the old one goes: the built-in engine's after it is
    marked handed over (nothing unloaded); KMM's by deletion, which KMM answers
    by unloading, so that waits for GPU claims, and the built-in engine's loaders
    load again what KMM took away."""
    new, old = _ENGINE_NAMES[desired["apiVersion"]], _ENGINE_NAMES[others[0]["apiVersion"]]
    alive = [o for o in others if not _deleting(o)]
    if not _serving(same):
        available, wanted = _counts(same)
        step = f"{old} to {new}: waiting for {new} to load the driver on every node"
        return ModuleOutcome(
            [desired, *(held(o) for o in alive)],
            _column(alive[0] if alive else same),
            _pending(others),
            RECHECK_SECONDS,
            serving=old,
            switch=f"{step} ({available}/{wanted})",
        )
    kept, errors, step = [], _pending(others), f"{old} to {new}: removing the {old} Module"
    for other in alive:
        if other["apiVersion"] == API_VERSIONS["Builtin"]:
            marked = ((other.get("metadata") or {}).get("annotations") or {}).get(HANDED_OVER)
            if marked != "true":  # marked first, so its engine leaves the driver loaded
                kept.append(_handed_over(other))
        elif claims:
            kept.append(held(other))
            errors.append(_blocked(other, f"deletion for the switch to {new}"))
    return ModuleOutcome(
        [desired, *kept],
        _column(same),
        errors,
        RECHECK_SECONDS,
        serving=new,
        switch=step,
    )


def _column(module: Obj | None) -> str:
    available, wanted = _counts(module)
    return f"{available}/{wanted}"


def _handed_over(live: Obj) -> dict[str, Any]:
    kept = held(live)
    meta = kept["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), HANDED_OVER: "true"}
    return kept


BLOCKING = "allocated GPU ResourceClaims blocking"


def _blocked(module: Obj, what: str) -> str:
    """The documented message, word for word; the claims are in status.blockingClaims."""
    return f"{BLOCKING} {reference(module)} {what}"
