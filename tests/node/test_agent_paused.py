"""A paused policy holds back the pods that already run: while the pause file says
``true`` the agent changes nothing in the kernel by itself.

The file stands for the policy's control ConfigMap the kubelet keeps current in the
builder pod. Rolling a node back to DKMS rmmods the operator's driver under a
running builder; a loader that loaded it again would fight the reinstall.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from kmodkit.agent.lifecycle import serve
from tests.node.harness import DEP, TOP, Node


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _pause_file(node: Node, paused: bool) -> Path:
    path = node.tmp / "policy" / "paused"
    path.parent.mkdir(exist_ok=True)
    path.write_text("true" if paused else "false")
    return path


def test_a_paused_loader_does_not_load_again_a_driver_an_admin_removed(node: Node) -> None:
    node.image_pair()
    pause = _pause_file(node, paused=False)
    agent = node.agent(node.config(pauseFile=str(pause)))
    stop = threading.Event()
    loader = threading.Thread(
        target=serve,
        args=(agent, stop),
        kwargs={"unload_on_terminate": False, "recheck_seconds": 0},
        daemon=True,
    )
    loader.start()
    try:
        _wait_for(lambda: bool(node.events("serving")))
        pause.write_text("true")
        _wait_for(lambda: bool(node.events("paused")))
        node.kernel(["rmmod", TOP])  # the admin's first step back to DKMS
        time.sleep(2.5)  # two looks at the kernel, at least
        assert TOP not in node.loaded()
        assert not node.events("module.disappeared")

        pause.write_text("false")
        _wait_for(lambda: node.loaded() == [DEP, TOP])
        assert node.events("unpaused")
    finally:
        stop.set()
        loader.join(timeout=10)


def test_a_load_that_would_change_the_kernel_waits_for_the_unpause(node: Node) -> None:
    node.image_pair()
    pause = _pause_file(node, paused=True)
    agent = node.agent(node.config(pauseFile=str(pause)))
    loader = threading.Thread(target=agent.load, daemon=True)
    loader.start()
    _wait_for(lambda: bool(node.events("load.paused")))
    time.sleep(0.3)
    assert loader.is_alive() and node.loaded() == []

    pause.write_text("false")
    loader.join(timeout=10)
    assert not loader.is_alive()
    assert node.loaded() == [DEP, TOP]


def test_a_paused_load_with_nothing_to_change_goes_on(node: Node) -> None:
    node.image_pair()
    node.agent().load()
    pause = _pause_file(node, paused=True)
    node.agent(node.config(pauseFile=str(pause))).load()  # returns: already at the version
    assert node.events("ready") and not node.events("load.paused")
