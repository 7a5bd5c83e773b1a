"""``kmodkit-agent run``: the long-running loader container.

Load, then stay up, looking at the kernel every 10 s: load again if the driver
vanished (a manual rmmod, a crashed module) and keep what it saw for the pod's
readiness probe (``kmodkit.agent.readiness``), until the kubelet sends SIGTERM.
Each look also checks for DKMS: an admin rolling the node back to DKMS gets a
loader that stands down (``Outcome.HOST_MANAGED``, the driver left loaded) so
its entrypoint reports the node host-managed again. What happens
then is a choice (``unloadOnTerminate``): unloading frees the node for another
driver; leaving the module loaded keeps workloads running across a loader pod
restart or an operator upgrade (the built-in engine's loaders leave it, and
unload only with an explicit ``kmodkit-agent unload``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from enum import Enum
from types import FrameType
from typing import Protocol

from kmodkit.agent.actions import NodeAgent
from kmodkit.agent.errors import AgentError, HostManaged
from kmodkit.agent.host_mode import InstallMode, detect_host_mode
from kmodkit.agent.readiness import Readiness

# How often the idle loop wakes to notice a stop request.
_WAKE_SECONDS = 1.0
# How often a serving loader looks whether its driver is still loaded.
RECHECK_SECONDS = 10.0
# Looks missed in a row before the readiness answer counts as stale.
STALE_AFTER_CHECKS = 6
# DKMS loads the driver on such a node: this pod's own module is not what runs.
HOST_MANAGED_PROBLEM = "DKMS manages the driver on this node"


class Outcome(Enum):
    STOPPED = "stopped"
    """The kubelet asked the loader to stop."""
    HOST_MANAGED = "host_managed"
    """DKMS signals appeared while serving: the driver is the host's again."""


class Stop(Protocol):
    """What ``serve`` waits on: a ``StopRequest``, or a ``threading.Event`` in-process."""

    def wait(self, timeout: float) -> bool: ...


class StopRequest:
    """A stop flag that a signal handler may raise at any instant.

    ``threading.Event.set`` takes the event's lock, and a handler runs in the main
    thread between two of its bytecodes: if that thread is inside ``Event.wait``
    holding the same lock, the handler waits on itself forever and the loader
    hangs until the kubelet kills it. Raising this takes no lock: a flag, and one
    byte into a pipe that ``wait`` selects on.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._raised = False

    def set(self) -> None:
        self._raised = True
        # Full pipe: an earlier byte already wakes every wait.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"!")

    def wait(self, timeout: float) -> bool:
        """True once raised, whether before or during the wait."""
        if not self._raised:
            select.select([self._read], [], [], timeout)
        return self._raised


def install_stop_handlers() -> StopRequest:
    stop = StopRequest()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def loop_readiness(recheck_seconds: float = RECHECK_SECONDS) -> Readiness:
    """What a loop looking every ``recheck_seconds`` keeps, stale after a few missed looks."""
    return Readiness(stale_after=STALE_AFTER_CHECKS * recheck_seconds)


def serve(
    agent: NodeAgent,
    stop: Stop,
    *,
    unload_on_terminate: bool,
    recheck_seconds: float = RECHECK_SECONDS,
    readiness: Readiness | None = None,
) -> Outcome:
    """Load, then look every ``recheck_seconds``: load a vanished driver again and
    keep in ``readiness`` what the kernel has (the pod's readiness probe reads it)."""
    readiness = readiness or loop_readiness(recheck_seconds)
    host_managed = False
    with agent.serving():
        try:
            agent.load()
        except HostManaged as exc:
            # Not a failure: a DKMS node keeps its pod up (and reported) so the
            # operator can label it; the driver is simply not ours to touch.
            host_managed = True
            agent.log.warning("host_managed.idle", message=exc.message, **exc.fields)
        agent.log.info("serving", unload_on_terminate=unload_on_terminate)
        _look(agent, readiness, host_managed)
        next_check = time.monotonic() + recheck_seconds
        paused = False
        while not stop.wait(_WAKE_SECONDS):
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + recheck_seconds
            if not host_managed and _dkms_returned(agent):
                return Outcome.HOST_MANAGED
            if agent.paused() != paused:
                paused = not paused
                agent.log.info("paused" if paused else "unpaused")
            if not host_managed and not paused:
                try:
                    agent.reload_if_gone()
                except AgentError as exc:  # the readiness says so; tried again later
                    agent.log.error(exc.event, message=exc.message, **exc.fields)
            _look(agent, readiness, host_managed)
    if host_managed or not unload_on_terminate:
        agent.log.info("terminating.left_loaded", host_managed=host_managed)
        return Outcome.STOPPED
    agent.log.info("terminating.unloading")
    agent.unload(force=agent.config.force_unload)
    return Outcome.STOPPED


def _dkms_returned(agent: NodeAgent) -> bool:
    # Checked before any reload: a driver DKMS is reinstalling is not ours to load again.
    report = detect_host_mode(agent.host, agent.config.dkms_names)
    if report.mode is not InstallMode.HOST:
        return False
    agent.log.warning(
        "host_managed.detected",
        message="DKMS manages the driver on this node again; the loader stands down "
        "and leaves the loaded driver in place",
        signals=[s.path for s in report.signals],
    )
    return True


def _look(agent: NodeAgent, readiness: Readiness, host_managed: bool) -> None:
    """Record what the kernel has now; log it only when it changed."""
    problems = [HOST_MANAGED_PROBLEM] if host_managed else agent.readiness()
    if readiness.record(problems):
        agent.log.info("readiness", ready=not problems, problems=problems)
