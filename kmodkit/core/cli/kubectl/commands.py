"""The ``kubectl kmodkit`` command: ``status`` and the verbs, thin over the pure parts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from kmodkit.core.cli.kubectl import cluster, verbs, views
from kmodkit.core.cli.kubectl.kinds import Kind, kinds, kinds_named, pick, split_ref
from kmodkit.core.schema.crd import MODULE_CRD

RETRIES = 3
"""Read-decide-write rounds of a node verb; only ``retry``'s write is refused when the node
changed since it was read, which a node's own status updates make likely on a busy node."""

Conn = tuple[str | None, str | None]


@contextmanager
def _api_errors() -> Iterator[None]:
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as e:
        raise click.ClickException(f"the API server refused: {e.status} {e.reason}") from e


def _report(edit: verbs.Edit) -> None:
    for line in [str(c) for c in edit.changes] or [edit.already]:
        click.echo(line)
    for note in edit.notes:
        click.echo(f"note: {note}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Path of the kubeconfig file.")
@click.option("--context", help="kubeconfig context to use.")
@click.pass_context
def main(ctx: click.Context, kubeconfig: str | None, context: str | None) -> None:
    """kmodkit's view of the fleet, and the verbs admins otherwise type as node labels."""
    ctx.obj = (kubeconfig, context)


@main.command()
@click.option(
    "--namespace", "-n", help="Only Modules in this namespace (policies are cluster-wide)."
)
@click.option("--watch", "-w", is_flag=True, help="Keep the view open, redrawn every interval.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--node", help="Show one node: its kmodkit labels, rollout states and events.")
@click.pass_obj
def status(
    obj: Conn, namespace: str | None, watch: bool, interval: float, node: str | None
) -> None:
    """Every Module and policy: progress, nodes per state, what blocks them, failures."""
    api = cluster.client(*obj)
    known = kinds()
    console = Console()

    def render() -> Any:
        if node:
            return views.node_view(cluster.read_node(api, node), cluster.node_events(api, node))
        rows, unserved = cluster.collect(api, namespace, known)
        if not watch:
            return views.table(rows, unserved)
        at = datetime.now(UTC).strftime("%H:%M:%S UTC")
        return views.live(rows, unserved, api.configuration.host, at, interval)

    with _api_errors():
        if not watch:
            console.print(render())
            return
        # The alternate screen: each frame replaces the last, and the shell's
        # screen comes back as it was on Ctrl-C.
        with Live(render(), console=console, screen=True, auto_refresh=False) as live:
            try:
                while True:
                    time.sleep(interval)
                    live.update(render(), refresh=True)
            except KeyboardInterrupt:
                pass


def _policy(api: Any, known: list[Kind], ref: str, namespace: str | None) -> tuple[Kind, Any]:
    kind_word, name = split_ref(ref)
    return pick(ref, cluster.find(api, known, kind_word, name, namespace))


def _pause(obj: Conn, ref: str, namespace: str | None, paused: bool) -> None:
    api = cluster.client(*obj)
    known = kinds()
    with _api_errors():
        kind, found = _policy(api, known, ref, namespace)
        pausable = [k for k in known if k.controls and k.controls.pause_field]
        edit = verbs.pause(kind, found, paused, pausable)
        if edit.body is not None:
            cluster.patch_object(api, kind, found, edit.body)
    _report(edit)


def _pause_command(name: str, paused: bool, summary: str) -> None:
    @main.command(name, help=summary)
    @click.argument("policy", metavar="[KIND/]NAME")
    @click.option("--namespace", "-n", help="Namespace of a namespaced kind's object.")
    @click.pass_obj
    def command(obj: Conn, policy: str, namespace: str | None) -> None:
        _pause(obj, policy, namespace, paused)


_pause_command("pause", True, "Start no new node in POLICY's rollout (nodes in flight finish).")
_pause_command("resume", False, "Let POLICY's rollout start nodes again.")


def _skip_labels(known: list[Kind], kind_word: str | None) -> list[str]:
    chosen = kinds_named(kind_word, known)
    found = sorted({k.controls.skip_label for k in chosen if k.controls and k.controls.skip_label})
    if not found:
        names = ", ".join(k.crd.kind for k in chosen)
        raise click.UsageError(f"no skip label: {names} take every node they select")
    return found


def _node_edit(obj: Conn, node: str, decide: Callable[[Any, Any], verbs.Edit]) -> None:
    """Read the node, decide, write; again if the node changed in between."""
    api = cluster.client(*obj)
    with _api_errors():
        for _ in range(RETRIES):
            edit = decide(api, cluster.read_node(api, node))
            if edit.body is None or cluster.patch_node(api, node, edit.body):
                _report(edit)
                return
    raise click.ClickException(f"node/{node} kept changing while being written; run it again")


def _skip_command(name: str, on: bool, summary: str) -> None:
    @main.command(name, help=summary)
    @click.argument("node")
    @click.option(
        "--kind", "kind_word", help="Only this kind's skip label (default: every kind's)."
    )
    @click.pass_obj
    def command(obj: Conn, node: str, kind_word: str | None) -> None:
        keys = _skip_labels(kinds(), kind_word)
        _node_edit(obj, node, lambda _api, n: verbs.skip(n, keys, on))


_skip_command("skip", True, "Take NODE out of rollouts: set every kind's skip label (or --kind's).")
_skip_command("unskip", False, "Give NODE back to rollouts: remove the skip labels skip sets.")


@main.command()
@click.argument("node")
@click.option(
    "--policy",
    metavar="[KIND/]NAME",
    help="Only this policy's rollout (default: every failed one).",
)
@click.pass_obj
def retry(obj: Conn, node: str, policy: str | None) -> None:
    """Retry NODE where it failed: clear its failed rollout state (its cordon stays until done)."""
    known = kinds()

    def decide(api: Any, n: Any) -> verbs.Edit:
        policy_id = None
        if policy is not None:
            kind, found = _policy(api, known, policy, None)
            if kind.controls is None:
                raise click.ClickException(
                    f"{verbs.ref_of(kind, found)}: a {kind.crd.kind} has no node-by-node rollout"
                )
            policy_id = kind.controls.policy_id(str(found["metadata"]["name"]))
        return verbs.retry(n, policy_id)

    _node_edit(obj, node, decide)


@main.command()
@click.argument("node")
@click.option("--module", "module_ref", required=True, metavar="NS/NAME", help="The Module.")
@click.option("--version", required=True, help="The Module version NODE should run.")
@click.pass_obj
def upgrade(obj: Conn, node: str, module_ref: str, version: str) -> None:
    """Move NODE to VERSION of a Module: KMM's ordered-upgrade label on the node."""
    namespace, slash, name = module_ref.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise click.UsageError(f"--module {module_ref!r} is not NAMESPACE/NAME")

    def decide(api: Any, n: Any) -> verbs.Edit:
        return verbs.upgrade(n, cluster.read_module(api, namespace, name, MODULE_CRD), version)

    _node_edit(obj, node, decide)
