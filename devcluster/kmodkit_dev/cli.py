"""``kmodkit dev``: a real local control plane for the demo and the tests."""

from __future__ import annotations

import click

from kmodkit_dev import build, cluster, realnode
from kmodkit_dev.nodes import PROFILES


@click.group()
def dev() -> None:
    """Run a local Kubernetes control plane with kwok fake nodes."""


@dev.command()
@click.option(
    "--nodes",
    default=6,
    show_default=True,
    type=click.IntRange(0, 20000),
    help="How many kwok nodes to create.",
)
@click.option(
    "--profile",
    type=click.Choice(PROFILES),
    default="mixed",
    show_default=True,
    help="Which accelerators the fake nodes carry.",
)
@click.option(
    "--name",
    default="default",
    show_default=True,
    help="Cluster name; several clusters can run side by side.",
)
@click.option(
    "--real-node",
    is_flag=True,
    help="Also start a real node: kubelet and containerd in a qemu VM on Debian's kernel.",
)
def up(nodes: int, profile: str, name: str, real_node: bool) -> None:
    """Start etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1."""
    try:
        cluster.up(name, nodes=nodes, profile=profile, echo=click.echo, real_node=real_node)
    except (build.BuildError, cluster.ClusterError, realnode.RealNodeError) as e:
        raise click.ClickException(str(e)) from e


@dev.command()
@click.option("--name", default="default", show_default=True)
def down(name: str) -> None:
    """Stop every process of the cluster and remove its state."""
    cluster.down(name, echo=click.echo)


@dev.command()
@click.option("--name", default="default", show_default=True)
def status(name: str) -> None:
    """Show what runs and where the kubeconfig is."""
    c = cluster.load(name)
    if c is None:
        click.echo(f"devcluster {name!r} is not running")
        raise SystemExit(1)
    running = c.running()
    for component, alive in running.items():
        log = c.log(component)
        click.echo(
            f"{component:26} {'running' if alive else 'STOPPED':8} pid {c.pids[component]}"
            + (f"  log {log}" if log.exists() else "")
        )
    click.echo(f"apiserver  {c.server}")
    click.echo(f"kubeconfig {c.kubeconfig}")
    if not all(running.values()):
        raise SystemExit(1)
