"""What ``status`` draws: the fleet table (with a header when live) and one node (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kmodkit.core import labels
from kmodkit.core.cli.kubectl.rows import Row
from kmodkit.core.rollout.keys import ROLLOUT_ATTEMPT_SUFFIX, ROLLOUT_PREFIX

BAR_WIDTH = 20
MAX_EVENTS = 15
# Upstream KMM's version controller writes its node keys under this prefix.
KMM_BETA_PREFIX = "beta.kmm.node.kubernetes.io"
NODE_LABEL_PREFIXES = (
    f"{labels.KMM_PREFIX}/",
    f"{KMM_BETA_PREFIX}/",
    f"{ROLLOUT_PREFIX}/",
)
COLUMNS = (
    "KIND",
    "NAME",
    "ENGINE",
    "VERSION",
    "PROGRESS",
    "NODES",
    "READY",
    "BLOCKING",
    "FAILURES",
)
UNWRAPPED = frozenset({"KIND", "NAME", "ENGINE", "VERSION", "PROGRESS"})


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``████░░░░ 2/4``: done of total, the bar never full before every node is."""
    filled = width if total and done >= total else (width * done // total if total else 0)
    return "█" * filled + "░" * (width - filled) + f" {done}/{total}"


def table(rows: Sequence[Row], unserved: Sequence[str] = ()) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in COLUMNS:
        # What names a row never wraps (a narrow terminal folds the prose columns).
        t.add_column(col, overflow="fold", no_wrap=col in UNWRAPPED)
    for r in sorted(rows, key=lambda r: (r.kind, r.name)):
        t.add_row(
            r.kind,
            r.name,
            r.engine,
            r.version,
            bar(*r.progress) if r.progress else "-",
            r.nodes,
            r.ready,
            r.blocking or "-",
            r.failures or "-",
        )
    if not rows:
        t.add_row("-", "no Modules or policies found", *[""] * (len(COLUMNS) - 2))
    if unserved:
        t.caption = f"not served by this cluster: {', '.join(unserved)}"
    return t


def live(rows: Sequence[Row], unserved: Sequence[str], where: str, at: str, every: float) -> Group:
    """One frame of ``status --watch``: a header saying what and when, then the table."""
    head = Text.assemble(
        ("kmodkit status", "bold"), f"  {where}  {at}  every {every:g}s  (Ctrl-C quits)"
    )
    return Group(head, "", table(rows, unserved))


def node_view(node: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> Group:
    """One node: kmodkit's labels, rollout states with their reasons, recent events."""
    meta = node.get("metadata") or {}
    node_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    info = (node.get("status") or {}).get("nodeInfo") or {}
    head = Table(box=None, show_header=False, pad_edge=False)
    head.add_row("Node", str(meta.get("name")))
    head.add_row("Kernel", str(info.get("kernelVersion", "-")))
    head.add_row(
        "Schedulable", "no (cordoned)" if (node.get("spec") or {}).get("unschedulable") else "yes"
    )

    label_table = Table(title="Labels", box=None, title_justify="left", pad_edge=False)
    label_table.add_column("KEY")
    label_table.add_column("VALUE")
    for key in sorted(node_labels):
        if key.startswith(NODE_LABEL_PREFIXES):
            label_table.add_row(key, node_labels[key] or '""')

    rollouts = Table(title="Rollouts", box=None, title_justify="left", pad_edge=False)
    for col in ("POLICY", "STATE", "ATTEMPT", "REASON", "MESSAGE"):
        rollouts.add_column(col, overflow="fold")
    prefix = f"{ROLLOUT_PREFIX}/"
    for key in sorted(k for k in node_labels if k.startswith(prefix)):
        rollouts.add_row(
            key.removeprefix(prefix),
            node_labels[key],
            annotations.get(f"{key}{ROLLOUT_ATTEMPT_SUFFIX}", "-"),
            annotations.get(f"{key}.reason", "-"),
            annotations.get(f"{key}.message", "-"),
        )

    recent = Table(title="Recent events", box=None, title_justify="left", pad_edge=False)
    for col in ("LAST SEEN", "TYPE", "REASON", "FROM", "MESSAGE"):
        recent.add_column(col, overflow="fold")
    ordered = sorted(events, key=_event_time, reverse=True)[:MAX_EVENTS]
    for ev in ordered:
        recent.add_row(
            _event_time(ev),
            str(ev.get("type", "")),
            str(ev.get("reason", "")),
            str((ev.get("source") or {}).get("component") or ev.get("reportingComponent") or ""),
            str(ev.get("message", "")),
        )
    return Group(head, "", label_table, "", rollouts, "", recent)


def _event_time(ev: Mapping[str, Any]) -> str:
    return str(
        ev.get("lastTimestamp")
        or ev.get("eventTime")
        or (ev.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
