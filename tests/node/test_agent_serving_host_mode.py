"""A serving loader looks for DKMS on every check, not only when it starts.

Rolling a node back to DKMS reinstalls the driver under a running builder: once
DKMS's signals are back the loader must stand down (leaving whatever is loaded)
so its entrypoint can label the node ``install-mode=host`` again.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from kmodkit.agent.errors import ExitCode
from kmodkit.agent.lifecycle import Outcome, serve
from tests.node.harness import DEP, TOP, Node


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_serving_loader_stands_down_when_dkms_returns(node: Node) -> None:
    node.image_pair()
    stop = threading.Event()
    outcome: list[Outcome] = []
    loader = threading.Thread(
        target=lambda: outcome.append(
            serve(node.agent(), stop, unload_on_terminate=True, recheck_seconds=0)
        ),
        daemon=True,
    )
    loader.start()
    try:
        _wait_for(lambda: bool(node.events("serving")))
        node.write_host("/var/lib/dkms/tenstorrent/2.8.0/source")
        loader.join(timeout=10)
        assert not loader.is_alive(), "the loader must stop serving once DKMS is back"
    finally:
        stop.set()
    assert outcome == [Outcome.HOST_MANAGED]
    detected = node.events("host_managed.detected")
    assert detected and detected[0]["signals"] == ["/var/lib/dkms/tenstorrent"]
    # Even with unloadOnTerminate: the driver is DKMS's business now.
    assert node.loaded() == [DEP, TOP]
    assert not node.kmod_calls("rmmod")


def test_the_run_process_exits_host_managed_when_dkms_returns(node: Node) -> None:
    node.preload_pair("2.9.0")
    process = node.run_agent("--recheck-seconds", "0.1")
    assert process.stdout is not None
    output: list[dict[str, Any]] = []
    try:
        for line in process.stdout:
            output.append(json.loads(line))
            if output[-1]["event"] == "serving":
                break
        node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")
        rest, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
    output += [json.loads(line) for line in rest.splitlines()]
    assert process.returncode == ExitCode.HOST_MANAGED
    events = [r["event"] for r in output]
    assert "host_managed.detected" in events and events[-1] == "exit"
    assert node.loaded() == [DEP, TOP]
