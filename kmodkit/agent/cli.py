"""``kmodkit-agent``: the command the loader and builder pods run.

Every subcommand writes JSON lines to stdout and exits with a code from
``kmodkit.agent.errors.ExitCode`` (documented in docs/node-agent.md). Tests pass a
``HostAccess`` as the click context object to run the same commands against a
simulated kernel.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kmodkit.agent.actions import HostAccess, NodeAgent, report_host_mode
from kmodkit.agent.atomic_file import install_file
from kmodkit.agent.config import AgentConfig, load_config
from kmodkit.agent.errors import AgentError, ConfigError, ExitCode, HostManaged
from kmodkit.agent.host_mode import InstallMode
from kmodkit.agent.hostroot import HostRoot
from kmodkit.agent.jsonlog import EventLog
from kmodkit.agent.lifecycle import (
    RECHECK_SECONDS,
    Outcome,
    install_stop_handlers,
    loop_readiness,
    serve,
)
from kmodkit.agent.readiness import serve_readiness
from kmodkit.agent.staging import STAGING_ENV, claimed, release_module


@dataclass(frozen=True)
class _Invocation:
    access: HostAccess
    host: HostRoot
    config_path: Path | None

    def config(self, **overrides: Any) -> AgentConfig:
        if self.config_path is None:
            raise ConfigError("this command needs --config (or KMODKIT_AGENT_CONFIG)")
        config = load_config(self.config_path)
        updates = {key: value for key, value in overrides.items() if value is not None}
        return config.model_copy(update=updates) if updates else config

    def agent(self, log: EventLog, **overrides: Any) -> NodeAgent:
        return NodeAgent(self.config(**overrides), self.host, log, self.access)


# Where the kubelet reads a container's last words (the pod's terminationMessagePath):
# the operator reports a failed load or unload from there, naming the holders.
TERMINATION_LOG = Path(os.environ.get("KMODKIT_TERMINATION_LOG", "/dev/termination-log"))
_TERMINATION_LIMIT = 4096  # the kubelet keeps no more


def _finish(command: str, body: Callable[[EventLog], ExitCode | None]) -> None:
    """Run one subcommand: log its failure as one line, always log the exit code."""
    log = EventLog(command)
    try:
        code = body(log) or ExitCode.OK
    except AgentError as exc:
        log.error(exc.event, message=exc.message, **exc.fields)
        _last_words(exc.message)
        code = exc.exit_code
    except Exception as exc:  # the last line of defence: still one JSON line, never a bare trace
        log.error(
            "crashed", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
        )
        _last_words(f"{type(exc).__name__}: {exc}")
        code = ExitCode.FAILED
    log.info("exit", exit_code=int(code), result=code.name.lower())
    raise SystemExit(int(code))


def _last_words(message: str) -> None:
    # Only a file the kubelet mounted: outside a pod there is nobody to read it.
    if TERMINATION_LOG.is_file():
        with contextlib.suppress(OSError):
            TERMINATION_LOG.write_text(message[:_TERMINATION_LIMIT])


_force_option = click.option(
    "--force-unload/--no-force-unload",
    default=None,
    help="SIGKILL the processes holding the device before unloading (overrides forceUnload).",
)


@click.group()
@click.option(
    "--host-root",
    type=click.Path(path_type=Path, file_okay=False),
    default="/",
    show_default=True,
    envvar="KMODKIT_HOST_ROOT",
    help="Where the host's root filesystem is mounted in this container.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="KMODKIT_AGENT_CONFIG",
    help="Agent configuration, YAML or JSON.",
)
@click.pass_context
def main(ctx: click.Context, host_root: Path, config_path: Path | None) -> None:
    """Load, unload and report an out-of-tree kernel driver on this node."""
    access = ctx.obj if isinstance(ctx.obj, HostAccess) else HostAccess()
    ctx.obj = _Invocation(access, HostRoot(host_root), config_path)


@main.command()
@click.option(
    "--dkms-module",
    "dkms_modules",
    multiple=True,
    help="DKMS module name to look for (repeatable); default: from --config.",
)
@click.pass_obj
def detect(inv: _Invocation, dkms_modules: tuple[str, ...]) -> None:
    """Report whether DKMS manages the driver. Exit 0: container, 4: host."""

    def body(log: EventLog) -> ExitCode:
        names = list(dkms_modules) if dkms_modules else inv.config().dkms_names
        report = report_host_mode(inv.host, names, log)
        return ExitCode.HOST_MANAGED if report.mode is InstallMode.HOST else ExitCode.OK

    _finish("detect", body)


@main.command()
@_force_option
@click.option("--kernel-version", default=None, help="Override the kernel read from the host.")
@click.pass_obj
def load(inv: _Invocation, force_unload: bool | None, kernel_version: str | None) -> None:
    """Load the driver (replacing a stale one) and verify it is live."""
    _finish(
        "load",
        lambda log: inv.agent(log, force_unload=force_unload, kernel_version=kernel_version).load(),
    )


@main.command()
@_force_option
@click.option(
    "--host-managed-ok",
    is_flag=True,
    help="Exit 0 on a DKMS-managed node: what DKMS loaded is not this agent's to unload.",
)
@click.pass_obj
def unload(inv: _Invocation, force_unload: bool | None, host_managed_ok: bool) -> None:
    """Unload the driver in reverse loading order; refuse while the device is held."""

    def body(log: EventLog) -> None:
        agent = inv.agent(log, force_unload=force_unload)
        with claimed(inv.host, os.environ.get(STAGING_ENV), log) as own:
            try:
                agent.unload(force=agent.config.force_unload)
            except HostManaged as exc:
                if not host_managed_ok:
                    raise
                log.info("unload.host_managed", message=exc.message, **exc.fields)
            if own is not None:
                removed = release_module(own)
                log.info("staging.released", copies=[inv.host.host_view(p) for p in removed])

    _finish("unload", body)


@main.command()
@click.option(
    "--ready-if-host-managed",
    is_flag=True,
    help="Exit 0 instead of 4 on a DKMS-managed node (for readiness probes).",
)
@click.pass_obj
def status(inv: _Invocation, ready_if_host_managed: bool) -> None:
    """Report what is loaded now. Exit 0: ready, 4: host-managed, 5: not ready."""

    def body(log: EventLog) -> ExitCode:
        agent = inv.agent(log)
        report = report_host_mode(inv.host, agent.config.dkms_names, log)
        if report.mode is InstallMode.HOST:
            agent.status()
            return ExitCode.OK if ready_if_host_managed else ExitCode.HOST_MANAGED
        return ExitCode.NOT_READY if agent.status() else ExitCode.OK

    _finish("status", body)


@main.command("install-file")
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.argument("target")
@click.option("--mode", default="0755", show_default=True, help="Octal file mode.")
@click.pass_obj
def install_file_command(inv: _Invocation, source: Path, target: str, mode: str) -> None:
    """Install SOURCE at host path TARGET atomically (readers never see a partial file)."""

    def body(log: EventLog) -> None:
        try:
            bits = int(mode, 8)
        except ValueError:
            raise ConfigError(f"--mode {mode!r} is not an octal file mode") from None
        changed = install_file(source, inv.host.path(target), bits)
        log.info(
            "host_file.installed" if changed else "host_file.unchanged",
            source=str(source),
            target=target,
            mode=f"{bits:04o}",
        )

    _finish("install-file", body)


@main.command()
@_force_option
@click.option(
    "--unload-on-terminate/--leave-loaded-on-terminate",
    default=None,
    help="On SIGTERM, unload the driver or leave it loaded (overrides unloadOnTerminate).",
)
@click.option(
    "--readiness-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Answer GET /readyz on this port (200 ready, 503 not) from the loop's last look.",
)
@click.option(
    "--recheck-seconds",
    type=click.FloatRange(min=0),
    default=RECHECK_SECONDS,
    show_default=True,
    help="How often the loop looks at the kernel and for DKMS.",
)
@click.option(
    "--readiness-host",
    default="",
    help="Address to answer readiness on; default: all (the kubelet probes the pod's IP).",
)
@click.pass_obj
def run(
    inv: _Invocation,
    force_unload: bool | None,
    unload_on_terminate: bool | None,
    readiness_port: int | None,
    recheck_seconds: float,
    readiness_host: str,
) -> None:
    """Load, then stay up until SIGTERM (the loader container's main process).

    Exits 4 (host-managed), the driver left loaded, when DKMS signals appear meanwhile."""
    stop = install_stop_handlers()

    def body(log: EventLog) -> ExitCode:
        agent = inv.agent(log, force_unload=force_unload, unload_on_terminate=unload_on_terminate)
        readiness = loop_readiness(recheck_seconds)
        if readiness_port is not None:
            serve_readiness(readiness, readiness_port, readiness_host)
        with claimed(inv.host, os.environ.get(STAGING_ENV), log):
            outcome = serve(
                agent,
                stop,
                unload_on_terminate=agent.config.unload_on_terminate,
                recheck_seconds=recheck_seconds,
                readiness=readiness,
            )
        return ExitCode.HOST_MANAGED if outcome is Outcome.HOST_MANAGED else ExitCode.OK

    _finish("run", body)
