"""The build's output reaches the pod's log line by line while it runs, and a hung
build is stopped at its timeout with a message saying so.

The build command is a real process standing in for "clone tt-kmd, make modules":
it prints, then waits for the test before going on, so a line shows up in the log
only if the agent passes it on while the build is still running.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kmodkit.agent.build_cache import BuildFailed
from tests.node.harness import DEP, DEVICE, TOP, Node

REPO = Path(__file__).resolve().parents[2]

STEPWISE_BUILD = f"""
import os, sys, time
from pathlib import Path
sys.path.insert(0, {str(REPO)!r})
from tests.node.simulated_kernel import write_module

go = Path(sys.argv[1])
print("cloning tt-kmd", flush=True)
print("warning: from stderr", file=sys.stderr, flush=True)
while not go.exists():
    time.sleep(0.02)
print("make modules", flush=True)
out = Path(os.environ["KMODKIT_OUTPUT_DIR"])
write_module(out / "{DEP}.ko", "{DEP}", version=os.environ["KMODKIT_VERSION"])
write_module(out / "{TOP}.ko", "{TOP}", version=os.environ["KMODKIT_VERSION"],
             depends=["{DEP}"], devices=["{DEVICE}"])
"""


@pytest.fixture
def headers(node: Node) -> Node:
    node.write_host(f"/lib/modules/{node.kernel.release}/build/Makefile", "# kbuild\n")
    return node


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def _lines(node: Node) -> list[str]:
    return [e["line"] for e in node.events("build.output")]


def test_build_output_is_logged_as_it_happens(headers: Node) -> None:
    node = headers
    go = node.tmp / "go"
    script = node.tmp / "build.py"
    script.write_text(STEPWISE_BUILD)
    config = node.config(
        build={"command": [sys.executable, str(script), str(go)], "cacheDir": "/var/cache/tt"}
    )
    loader = threading.Thread(target=node.agent(config).load, daemon=True)
    loader.start()
    try:
        seen = _wait_for(lambda: "cloning tt-kmd" in _lines(node))
        assert seen, "the first build line must be in the log while the build still runs"
        assert "warning: from stderr" in _lines(node)
        assert "make modules" not in _lines(node) and node.loaded() == []
    finally:
        go.touch()
        loader.join(timeout=20)
    assert not loader.is_alive()
    assert _lines(node)[-1] == "make modules"
    assert node.loaded() == [DEP, TOP]


def test_a_hung_build_is_stopped_at_its_timeout_with_its_children(headers: Node) -> None:
    node = headers
    pid_file = node.tmp / "clone.pid"
    # A clone that never answers: the shell's child holds the output pipe open too.
    hung = f"echo cloning tt-kmd; sleep 600 & echo $! > {pid_file}; wait"
    config = node.config(
        build={"command": ["sh", "-c", hung], "cacheDir": "/var/cache/tt", "timeoutSeconds": 1}
    )
    failures: list[BuildFailed] = []

    def load() -> None:
        try:
            node.agent(config).load()
        except BuildFailed as exc:
            failures.append(exc)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(timeout=20)
    assert not loader.is_alive(), "a hung build must not hang the agent"
    (failure,) = failures
    assert "did not finish in 1s" in failure.message
    assert "the loaded driver was left in place" in failure.message
    assert _lines(node) == ["cloning tt-kmd"]
    clone = int(pid_file.read_text())
    assert _wait_for(lambda: not Path(f"/proc/{clone}").exists() or _zombie(clone), 5)
    assert node.loaded() == []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
