"""The loader's readiness probe: an HTTP answer from the serving loop's last look.

The probe must follow the live kernel (another build of the driver loaded under
the agent is not ready), cost no process and no kmod call per probe, and stop
saying ready when the loop stops looking.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from kmodkit.agent.host_lock import host_lock
from kmodkit.agent.lifecycle import serve
from kmodkit.agent.readiness import Readiness, serve_readiness
from kmodkit.agent.staging import STAGING_ENV, STAGING_ROOT, prune
from tests.node.harness import DEP, DEVICE, TOP, Node


def probe(port: int) -> tuple[int, str]:
    """What the kubelet's httpGet probe gets: the status code and the body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.fixture
def serving(node: Node) -> Iterator[tuple[Readiness, int]]:
    """A serving loop looking every 50 ms, its readiness answered on a loopback port."""
    node.image_module(DEP, version="2.9.0", srcversion="IMAGEDEP")
    node.image_module(TOP, version="2.9.0", srcversion="IMAGE", depends=[DEP], devices=[DEVICE])
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    readiness = Readiness(stale_after=5)
    server = serve_readiness(readiness, 0, "127.0.0.1")
    stop = threading.Event()
    loop = threading.Thread(
        target=serve,
        args=(node.agent(), stop),
        kwargs={"unload_on_terminate": False, "recheck_seconds": 0.05, "readiness": readiness},
    )
    loop.start()
    try:
        yield readiness, server.server_address[1]
    finally:
        stop.set()
        loop.join(timeout=10)
        server.shutdown()
    assert not loop.is_alive()


def test_the_probe_says_ready_once_loaded_and_costs_no_kmod_call(
    node: Node, serving: tuple[Readiness, int]
) -> None:
    _, port = serving
    _wait_for(lambda: probe(port)[0] == 200)
    assert probe(port) == (200, "ready\n")
    calls = len(node.kernel.calls)
    # Over two seconds the loop looks again (it wakes every second) and reads /sys
    # itself, the image's builds read once; neither it nor the probes run a kmod tool.
    for _ in range(20):
        assert probe(port)[0] == 200
        time.sleep(0.1)
    assert len(node.kernel.calls) == calls


def test_another_build_loaded_under_the_agent_is_not_ready(
    node: Node, serving: tuple[Readiness, int]
) -> None:
    _, port = serving
    _wait_for(lambda: probe(port)[0] == 200)
    # Another agent swaps in another build of the same version (under the lock, so
    # the loop never sees the driver gone): present, but not the image's build.
    with host_lock(node.host, TOP, timeout=1):
        node.kernel(["rmmod", TOP])
        node.preload(TOP, version="2.9.0", srcversion="OTHER", depends=[DEP], devices=[DEVICE])
    _wait_for(lambda: probe(port)[0] == 503)
    _, body = probe(port)
    assert body.startswith("not ready: ") and TOP in body and "OTHER" in body, body
    ready = node.events("readiness")
    assert [r["ready"] for r in ready] == [True, False]  # logged on change, not per look


def test_an_answer_the_loop_stopped_refreshing_is_not_ready() -> None:
    now = [100.0]
    readiness = Readiness(stale_after=60, clock=lambda: now[0])
    assert readiness.answer() == (False, "not ready: still loading")
    readiness.record([])
    now[0] += 60
    assert readiness.answer() == (True, "ready")
    now[0] += 1
    assert readiness.answer() == (False, "not ready: the kernel was last checked 61s ago")


def test_the_real_process_answers_on_its_readiness_port_and_holds_its_copy(node: Node) -> None:
    # Loaded and built on the node (no image to read with modinfo): no kmod tools needed.
    node.preload_pair("2.9.0")
    server = serve_readiness(Readiness(stale_after=1), 0, "127.0.0.1")
    port = server.server_address[1]
    server.shutdown()
    server.server_close()  # a port that was free a moment ago
    process = node.run_agent(
        "--readiness-port",
        str(port),
        "--readiness-host",
        "127.0.0.1",
        env={**os.environ, STAGING_ENV: f"{STAGING_ROOT}/drivers.tt/uid-1"},
    )
    copy = node.host.path(f"{STAGING_ROOT}/drivers.tt/uid-1")
    staging, long_ago = node.host.path(STAGING_ROOT), time.time() + 2 * 24 * 3600
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if json.loads(line)["event"] == "readiness":
                break
        assert probe(port) == (200, "ready\n")
        # Its copy of the image is held for as long as it runs, however old.
        assert prune(staging, keep=staging / "none", now=long_ago) == []
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
    assert process.returncode == 0
    assert prune(staging, keep=staging / "none", now=long_ago) == [copy]
