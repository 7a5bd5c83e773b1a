"""``kmodkit tenstorrent``: node operations for Tenstorrent clusters."""

from __future__ import annotations

import time
from typing import Any

import click

from kmodkit.backends.tenstorrent.vacate import DEFAULT_IMAGE, VACATED, vacate_pod


@click.group()
def tenstorrent() -> None:
    """Tenstorrent node operations (see docs/tenstorrent.md)."""


def _api() -> Any:
    from kubernetes import config

    untyped: Any = config
    return untyped.new_client_from_config()


def _phase(core: Any, name: str, namespace: str) -> str:
    return str(core.read_namespaced_pod(name, namespace).status.phase)


@tenstorrent.command("migrate-node")
@click.argument("node")
@click.option(
    "--namespace",
    "-n",
    envvar="KMODKIT_NAMESPACE",
    default="kmodkit-system",
    show_default=True,
    help="The operator's namespace: the vacate pod runs there.",
)
@click.option(
    "--image", default=DEFAULT_IMAGE, show_default=True, help="Any image with sh and chroot."
)
@click.option("--timeout", default=300, show_default=True, help="Seconds to wait for the pod.")
def migrate_node(node: str, namespace: str, image: str, timeout: int) -> None:
    """Vacate DKMS on NODE so the operator can manage its tt-kmd.

    Runs the migration guide's per-node procedure in a short-lived privileged pod: refuses
    (exit 3) while anything holds /dev/tenstorrent, otherwise unloads tt-kmd, removes DKMS's
    state and sources and stray tenstorrent.ko files, runs depmod, and verifies (exit 1 if
    something remains). Prints every finding and action. Safe to run again. Cordon and
    drain the node first, and keep its driver policy paused until this succeeds.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(_api())
    core.read_node(node)
    pod = vacate_pod(node, namespace, image)
    name = pod["metadata"]["name"]
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as err:
        if err.status != 404:
            raise
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.create_namespaced_pod(namespace, pod)
            break
        except ApiException as err:
            if err.status != 409 or time.monotonic() > deadline:
                raise
            time.sleep(1)
    try:
        while _phase(core, name, namespace) not in ("Succeeded", "Failed"):
            if time.monotonic() > deadline:
                raise click.ClickException(f"the vacate pod on {node} did not finish in {timeout}s")
            time.sleep(1)
        ended = next(
            (
                s.state.terminated
                for s in core.read_namespaced_pod(name, namespace).status.container_statuses or []
                if s.state and s.state.terminated
            ),
            None,
        )
        log = str(ended.message or "") if ended is not None else ""
        click.echo(log.rstrip())
        code = ended.exit_code if ended is not None else 1
    finally:
        core.delete_namespaced_pod(name, namespace)
    if code == 0 and VACATED in log:
        # The builder is not restarted: the standby one finds DKMS gone within
        # TT_REDETECT_SECONDS and takes the node over only once its policy is unpaused.
        click.echo(f"the builder on {node} takes it over within 30 s of its policy being unpaused")
    raise SystemExit(code)
