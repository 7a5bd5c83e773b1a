"""The policy's status: the columns Intel's operator shows, errors, and standard conditions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kmodkit.sdk import DEGRADED, PROGRESSING, READY, Obj

NOT_APPLICABLE = "N/A"
MAX_ERRORS = 10
MAX_BLOCKING_CLAIMS = 10


def _daemon_set(owned: Sequence[Obj], name: str) -> Obj | None:
    return next(
        (
            o
            for o in owned
            if o.get("kind") == "DaemonSet" and (o.get("metadata") or {}).get("name") == name
        ),
        None,
    )


def daemon_set_status(owned: Sequence[Obj], name: str, planned: bool) -> str:
    """``<ready>/<desired>`` pods of the component's DaemonSet, or N/A when it is not wanted."""
    if not planned:
        return NOT_APPLICABLE
    status = (_daemon_set(owned, name) or {}).get("status") or {}
    return f"{status.get('numberReady') or 0}/{status.get('desiredNumberScheduled') or 0}"


def daemon_set_observed(owned: Sequence[Obj], name: str) -> bool:
    """Whether the DaemonSet controller has counted the component's DaemonSet as it now
    stands: until then its ``0/0`` says nothing about the nodes."""
    obj = _daemon_set(owned, name)
    if obj is None:
        return False
    seen = (obj.get("status") or {}).get("observedGeneration")
    return seen is not None and seen >= ((obj.get("metadata") or {}).get("generation") or 0)


def progress(columns: Sequence[str], unobserved: Sequence[str] = ()) -> str:
    """Why the policy is still progressing, or ``""``: a component whose first status has not
    come yet, or one behind its nodes."""
    if unobserved:
        return f"waiting for the first status of {', '.join(unobserved)}"
    return "components are rolling out" if any(_behind(c) for c in columns) else ""


def progress_of(status: Mapping[str, Any]) -> str:
    """The progress a status's conditions say (what a plan found), to keep it when only the
    errors change."""
    for c in status.get("conditions") or []:
        if c.get("type") == PROGRESSING and c.get("status") == "True":
            return str(c.get("message", ""))
    return ""


def bounded(errors: Sequence[str]) -> list[str]:
    """Errors without repeats, at most MAX_ERRORS, the last saying how many were left out."""
    unique = list(dict.fromkeys(errors))
    if len(unique) <= MAX_ERRORS:
        return unique
    kept = unique[: MAX_ERRORS - 1]
    return [*kept, f"{len(unique) - len(kept)} more errors not shown"]


def _behind(value: str) -> bool:
    if value in ("Removing", "Recreating"):
        return True
    ready, _, desired = value.partition("/")
    return ready.isdigit() and desired.isdigit() and int(ready) < int(desired)


def conditions(
    old: Mapping[str, Any],
    generation: int | None,
    progressing: str,
    errors: Sequence[str],
    now: datetime,
) -> list[dict[str, Any]]:
    """Ready, Progressing (``progressing``: why, or ``""``) and Degraded; a condition keeps
    its transition time while unchanged."""
    previous = {c.get("type"): c for c in old.get("conditions") or []}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        status = "True" if ok else "False"
        prior = previous.get(kind) or {}
        since = prior.get("lastTransitionTime") if prior.get("status") == status else None
        entry = {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since or stamp,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        return entry

    first_error = errors[0] if errors else ""
    return [
        condition(
            READY,
            not errors and not progressing,
            "Failing" if errors else "Progressing" if progressing else "Ready",
            first_error or progressing or "all components ready",
        ),
        condition(
            PROGRESSING,
            bool(progressing),
            "RollingOut" if progressing else "Stable",
            progressing or "nothing in progress",
        ),
        condition(
            DEGRADED,
            bool(errors),
            "Errors" if errors else "NoErrors",
            first_error or "no errors",
        ),
    ]
