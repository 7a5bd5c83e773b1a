"""``kmodkit-agent run``: the long-running loader container.

Load, then stay up so the pod's readiness probe (``kmodkit-agent status``) keeps
reporting the live kernel state, and load again if the driver vanishes (a
manual rmmod, a crashed module), until the kubelet sends SIGTERM. What happens
then is a choice (``unloadOnTerminate``): unloading frees the node for another
driver; leaving the module loaded keeps workloads running across a loader pod
restart or an operator upgrade (the built-in engine's loaders leave it, and
unload only with an explicit ``kmodkit-agent unload``).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

from kmodkit.agent.actions import NodeAgent
from kmodkit.agent.errors import AgentError, HostManaged

# How often the idle loop wakes to notice a stop request.
_WAKE_SECONDS = 1.0
# How often a serving loader looks whether its driver is still loaded.
RECHECK_SECONDS = 10.0


def install_stop_handlers(stop: threading.Event) -> None:
    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def serve(
    agent: NodeAgent,
    stop: threading.Event,
    *,
    unload_on_terminate: bool,
    recheck_seconds: float = RECHECK_SECONDS,
) -> None:
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
        next_check = time.monotonic() + recheck_seconds
        while not stop.wait(_WAKE_SECONDS):
            if host_managed or time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + recheck_seconds
            try:
                agent.reload_if_gone()
            except AgentError as exc:  # reported by the status probe; tried again later
                agent.log.error(exc.event, message=exc.message, **exc.fields)
    if host_managed or not unload_on_terminate:
        agent.log.info("terminating.left_loaded", host_managed=host_managed)
        return
    agent.log.info("terminating.unloading")
    agent.unload(force=agent.config.force_unload)
