"""The ``kmodkit`` command."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """kmodkit: out-of-tree kernel drivers and device firmware on Kubernetes."""


@main.command()
@click.option("--namespace", "-n", envvar="KMODKIT_NAMESPACE", default="kmodkit-system",
              show_default=True, help="Namespace the operator runs in and owns objects in.")
@click.option("--health-port", envvar="KMODKIT_HEALTH_PORT", default=8080, show_default=True,
              type=int, help="Port of the liveness/readiness endpoint (/healthz).")
@click.option("--health-host", envvar="KMODKIT_HEALTH_HOST", default="0.0.0.0", show_default=True,
              help="Address the health endpoint listens on.")
@click.option("--backends", envvar="KMODKIT_BACKENDS", default="",
              help="Comma-separated backends to enable; empty enables every installed one.")
def run(namespace: str, health_port: int, health_host: str, backends: str) -> None:
    """Run the operator against the cluster of the current kubeconfig."""
    from core.runtime.operator import run_operator

    enabled = {b.strip() for b in backends.split(",") if b.strip()} or None
    raise SystemExit(run_operator(namespace=namespace, health_host=health_host,
                                  health_port=health_port, enabled=enabled))


def _add_dev_group() -> None:
    # devcluster ships with the package but is only a development aid; keep
    # its import lazy-free and cheap (it imports nothing heavy at module level).
    from devcluster.cli import dev

    main.add_command(dev)


_add_dev_group()
