"""One status row per Module or policy, read from the object alone (pure).

Every kind reports its progress its own way: a Module its loader counters, the
Tenstorrent policies a ``summary`` of counts, the Intel ClusterPolicy
``"<ready>/<desired>"`` strings per component. A row puts them side by side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kmodkit.core.cli.kubectl.kinds import Kind

MAX_FAILURES_SHOWN = 3
# Per-node status states that need nothing more: not worth a line under BLOCKING.
SETTLED_STATES = frozenset({"done", "ready", "hostmanaged", "skipped", "idle", "failed"})


@dataclass(frozen=True)
class Row:
    kind: str
    name: str
    engine: str
    version: str
    nodes: str
    ready: str
    failures: str
    progress: tuple[int, int] | None = None
    """(up to date, targeted), when the status says."""
    blocking: str = ""


def row(kind: Kind, obj: Mapping[str, Any]) -> Row:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    name = "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)
    container = (spec.get("moduleLoader") or {}).get("container") or {}
    version = (
        container.get("version")
        or spec.get("version")
        or status.get("desiredVersion")
        or (spec.get("kernelModule") or {}).get("version")
        or "-"
    )
    return Row(
        kind=kind.crd.kind,
        name=name,
        engine=str(status.get("engine") or kind.engine),
        version=str(version),
        nodes=_node_counts(status),
        ready=_ready(status),
        failures=_failures(status),
        progress=progress(status),
        blocking=blocking(kind, spec, status),
    )


def _node_counts(status: Mapping[str, Any]) -> str:
    loader = status.get("moduleLoader")
    if isinstance(loader, Mapping):
        failing = len(status.get("nodeFailures") or [])
        unmapped = len(status.get("unmappedNodes") or [])
        parts = [
            f"targeted={loader.get('nodesMatchingSelectorNumber', 0)}",
            f"loaded={loader.get('availableNumber', 0)}/{loader.get('desiredNumber', 0)}",
            *([f"failing={failing}"] if failing else []),
            *([f"unmapped={unmapped}"] if unmapped else []),
        ]
        return " ".join(parts)
    summary = status.get("summary")
    if isinstance(summary, Mapping):
        return " ".join(f"{k}={v}" for k, v in summary.items() if isinstance(v, int) and v) or "-"
    parts = [f"{key}={value}" for key, value in _components(status).items()]
    return " ".join(parts) or "-"


def _components(status: Mapping[str, Any]) -> dict[str, str]:
    """The ``"<ready>/<desired>"`` strings of backends that report components that way."""
    return {
        key.removesuffix("Status"): value
        for key, value in status.items()
        if key.endswith("Status") and isinstance(value, str) and value != "N/A"
    }


def progress(status: Mapping[str, Any]) -> tuple[int, int] | None:
    """(up to date, targeted) nodes; for components, the one furthest behind."""
    loader = status.get("moduleLoader")
    if isinstance(loader, Mapping):
        return _count(loader.get("availableNumber")), _count(loader.get("desiredNumber"))
    summary = status.get("summary")
    if isinstance(summary, Mapping):
        total = summary.get("matched", summary.get("targeted"))
        if isinstance(total, int):
            return _count(summary.get("upToDate")), total
        return None
    pairs = []
    for value in _components(status).values():
        done, slash, total = value.partition("/")
        if slash and done.isdigit() and total.isdigit():
            pairs.append((int(done), int(total)))
    return min(pairs, key=lambda p: p[0] / p[1] if p[1] else 1.0) if pairs else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


def blocking(kind: Kind, spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """What holds nodes back: a stopped rollout, and the reasons nodes wait (failures aside)."""
    found = []
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "Progressing"
            and cond.get("status") == "False"
            and cond.get("reason") != "Idle"
        ):
            found.append(f"{cond.get('reason')}: {cond.get('message')}")
    pause = kind.controls.pause_field if kind.controls else None
    if pause and spec.get(pause) is True and not any(f.startswith("Paused") for f in found):
        found.append(f"Paused: spec.{pause} is true")
    waiting: Counter[str] = Counter(
        str(n.get("reason"))
        for n in status.get("nodes") or []
        if isinstance(n, Mapping)
        and n.get("reason")
        and str(n.get("state", "")).lower() not in SETTLED_STATES
    )
    found += [f"{reason}: {n} node{'s' if n > 1 else ''}" for reason, n in sorted(waiting.items())]
    omitted = status.get("nodesOmitted")
    if waiting and isinstance(omitted, int) and omitted:
        found.append(f"(+{omitted} nodes not listed)")
    return "; ".join(found)


def _ready(status: Mapping[str, Any]) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            reason = cond.get("reason")
            return f"{cond.get('status')} ({reason})" if reason else str(cond.get("status"))
    return "-"


def _failures(status: Mapping[str, Any]) -> str:
    found = [
        f"{f.get('node')}: {f.get('reason')}"
        for f in status.get("nodeFailures") or []
        if isinstance(f, Mapping)
    ]
    found += [
        f"{n.get('name')}: {n.get('reason') or n.get('state')}"
        for n in status.get("nodes") or []
        if isinstance(n, Mapping) and "fail" in str(n.get("state", "")).lower()
    ]
    found += [str(e) for e in status.get("errors") or []]
    if not found:
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Degraded" and cond.get("status") == "True":
                found.append(str(cond.get("message") or cond.get("reason")))
    shown = found[:MAX_FAILURES_SHOWN]
    more = len(found) - len(shown)
    return "; ".join(shown) + (f" (+{more} more)" if more > 0 else "")
