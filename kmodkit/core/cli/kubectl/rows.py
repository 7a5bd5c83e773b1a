"""``kubectl kmodkit``: the fleet at a glance.

``status`` shows one table of every Module and every installed backend's
policies (those the apiserver serves): the engine, the version being rolled
out, how many nodes are in each state, and why nodes fail. ``--node`` shows
one node: its kmodkit labels, its rollout states and their reasons, and its
recent events. It reads the objects' status, which the operator keeps
bounded, so it costs the same on a 10-node and a 10,000-node cluster (except
``--node``, which reads one node and its events).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kmodkit.core import labels
from kmodkit.core.rollout.keys import ROLLOUT_ATTEMPT_SUFFIX, ROLLOUT_PREFIX
from kmodkit.core.schema.crd import MODULE_CRD, CrdSource

MAX_FAILURES_SHOWN = 3
# Upstream KMM's version controller writes its node keys under this prefix.
KMM_BETA_PREFIX = "beta.kmm.node.kubernetes.io"
MAX_EVENTS = 15
NODE_LABEL_PREFIXES = (
    f"{labels.KMM_PREFIX}/",
    f"{KMM_BETA_PREFIX}/",
    f"{ROLLOUT_PREFIX}/",
)


@dataclass(frozen=True)
class Kind:
    crd: CrdSource
    engine: str
    """Shown when the object's status does not say which engine serves it."""


@dataclass(frozen=True)
class Row:
    kind: str
    name: str
    engine: str
    version: str
    nodes: str
    ready: str
    failures: str


def kinds() -> list[Kind]:
    """The built-in Module and every installed backend's resources."""
    from kmodkit.core.runtime.plugins import discover

    found = [Kind(MODULE_CRD, "kmodkit")]
    for d in discover():
        if d.backend is not None:
            found += [Kind(r.crd, d.name) for r in d.backend.resources]
    return found


# -- rows (pure) ----------------------------------------------------------------


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
    # Backends that report components as "<ready>/<desired>" strings.
    parts = [
        f"{key.removesuffix('Status')}={value}"
        for key, value in status.items()
        if key.endswith("Status") and isinstance(value, str) and value != "N/A"
    ]
    return " ".join(parts) or "-"


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


def table(rows: Sequence[Row], unserved: Sequence[str] = ()) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("KIND", "NAME", "ENGINE", "VERSION", "NODES", "READY", "FAILURES"):
        t.add_column(col, overflow="fold")
    for r in sorted(rows, key=lambda r: (r.kind, r.name)):
        t.add_row(r.kind, r.name, r.engine, r.version, r.nodes, r.ready, r.failures or "-")
    if not rows:
        t.add_row("-", "no Modules or policies found", "", "", "", "", "")
    if unserved:
        t.caption = f"not served by this cluster: {', '.join(unserved)}"
    return t


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


# -- reading the cluster --------------------------------------------------------


def _client(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import config

    untyped: Any = config
    return untyped.new_client_from_config(config_file=kubeconfig, context=context)


def _list(api: Any, crd: CrdSource, namespace: str | None) -> list[dict[str, Any]] | None:
    """Every object of ``crd`` (None when the cluster does not serve it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    objects: Any = client.CustomObjectsApi(api)
    try:
        if crd.namespaced and namespace:
            resp = objects.list_namespaced_custom_object(
                crd.group, crd.version, namespace, crd.plural, _preload_content=False
            )
        else:
            resp = objects.list_cluster_custom_object(
                crd.group, crd.version, crd.plural, _preload_content=False
            )
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return list(json.loads(resp.data).get("items") or [])


def collect(api: Any, namespace: str | None) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    unserved: list[str] = []
    for kind in kinds():
        items = _list(api, kind.crd, namespace)
        if items is None:
            unserved.append(f"{kind.crd.plural}.{kind.crd.group}")
            continue
        rows += [row(kind, obj) for obj in items]
    return rows, unserved


def _node(api: Any, name: str) -> Group:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api)
    try:
        node = json.loads(core.read_node(name, _preload_content=False).data)
    except ApiException as e:
        if e.status == 404:
            raise click.ClickException(f"no node named {name!r} (kubectl get nodes)") from e
        raise
    resp = core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=Node,involvedObject.name={name}",
        _preload_content=False,
    )
    return node_view(node, json.loads(resp.data).get("items") or [])


# -- the command ----------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Path of the kubeconfig file.")
@click.option("--context", help="kubeconfig context to use.")
@click.pass_context
def main(ctx: click.Context, kubeconfig: str | None, context: str | None) -> None:
    """kmodkit's view of the fleet (installed as the kubectl plugin ``kubectl kmodkit``)."""
    ctx.obj = (kubeconfig, context)


@main.command()
@click.option(
    "--namespace", "-n", help="Only Modules in this namespace (policies are cluster-wide)."
)
@click.option("--watch", "-w", is_flag=True, help="Keep the view open, refreshed every interval.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--node", help="Show one node: its kmodkit labels, rollout states and events.")
@click.pass_obj
def status(
    obj: tuple[str | None, str | None],
    namespace: str | None,
    watch: bool,
    interval: float,
    node: str | None,
) -> None:
    """Every Module and policy: engine, version, nodes per state, failures and why."""
    from kubernetes.client.exceptions import ApiException

    api = _client(*obj)
    console = Console()

    def render() -> Any:
        if node:
            return _node(api, node)
        return table(*collect(api, namespace))

    try:
        if not watch:
            console.print(render())
            return
        with Live(render(), console=console, screen=False, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(), refresh=True)
    except ApiException as e:
        raise click.ClickException(f"the API server refused: {e.status} {e.reason}") from e
    except KeyboardInterrupt:
        pass
