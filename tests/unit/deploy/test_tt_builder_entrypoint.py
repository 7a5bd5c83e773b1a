"""The builder image's entrypoint ``tt-builder``, run for real under chroot with busybox.

Stand-ins (scripts in the chroot's /bin): ``kmodkit-agent``
answers detect, load and run from files the test writes (the real agent is
tested in tests/node), and ``curl`` records the node label patches it would send
to the API server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SCRIPT = (
    Path(__file__).resolve().parents[3] / "dockerfiles/tenstorrent/builder/tt-builder"
).read_text()

AGENT = r"""#!/bin/sh
for cmd; do :; done
echo "$cmd" >> /state/calls
case "$cmd" in
  detect)
    echo '{"event": "host_mode.detected"}'
    [ "$(cat /state/mode)" = host ] && exit 4
    exit 0 ;;
  load)
    echo '{"event": "build.output", "line": "cloning tt-kmd"}'
    while [ ! -e /state/go ]; do sleep 0.05; done
    echo '{"event": "ready"}' ;;
  run)
    trap 'echo "{\"event\": \"terminating\"}"; exit 0' TERM
    echo '{"event": "serving"}'
    while [ "$(cat /state/mode)" != host ]; do sleep 0.05; done
    echo '{"event": "host_managed.detected"}'
    exit 4 ;;
esac
"""
CURL = r"""#!/bin/sh
prev=""
for arg; do
  [ "$prev" = -d ] && echo "$arg" >> /state/labels
  prev=$arg
done
echo "$prev" >> /state/urls
"""


class Builder:
    def __init__(self, root: Path, process: subprocess.Popen[str]) -> None:
        self.root = root
        self.process = process
        self.lines: list[str] = []

    def set(self, name: str, text: str = "") -> None:
        (self.root / "state" / name).write_text(text)

    def labels(self) -> list[str]:
        path = self.root / "state" / "labels"
        return path.read_text().splitlines() if path.exists() else []

    def read_until(self, text: str, timeout: float = 10.0) -> None:
        """Read the builder's output as it comes, until a line contains ``text``."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if text in line:
                return
        raise AssertionError(f"no line with {text!r} in time; got {self.lines}")


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def builder(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Builder]:
    script = getattr(request, "param", SCRIPT)
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy(busybox, root / "bin" / "busybox")
    for tool in ("sh", "cat", "tee", "grep", "tail", "sleep", "mkdir", "echo", "[", "rm"):
        (root / "bin" / tool).symlink_to("busybox")
    for name, text in (("kmodkit-agent", AGENT), ("curl", CURL)):
        (root / "bin" / name).write_text(text)
        (root / "bin" / name).chmod(0o755)
    for directory in ("state", "dev", "run", "host/sys/module/tenstorrent"):
        (root / directory).mkdir(parents=True)
    (root / "host/sys/module/tenstorrent/version").write_text("2.9.0\n")
    (root / "state" / "mode").write_text("host")
    process = subprocess.Popen(
        [shutil.which("chroot") or "chroot", str(root), "/bin/sh", "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={
            "PATH": "/bin",
            "TT_KMD_VERSION": "2.9.0",
            "NODE_NAME": "node-1",
            "POD_NAME": "ttdrv-p-abcde",
            "TT_ROLLOUT_STATE_LABEL": "rollout.kmodkit.io/ttdp.p",
            "TT_REDETECT_SECONDS": "0.1",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "KUBERNETES_SERVICE_PORT": "6443",
        },
    )
    yield Builder(root, process)
    # The whole group: the stand-in agent the script started must not outlive the test.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def test_back_to_host_mode_when_dkms_returns_while_serving(builder: Builder) -> None:
    builder.set("mode", "container")
    builder.set("go")
    builder.read_until('"serving"')
    assert '"driver.tenstorrent.com/install-mode":"container"' in builder.labels()[-1]
    # At the kubernetes Service's address the kubelet gives every pod: no DNS needed.
    urls = (builder.root / "state" / "urls").read_text().split()
    assert set(urls) == {"https://10.96.0.1:6443/api/v1/nodes/node-1"}

    builder.set("mode", "host")  # the admin reinstalled DKMS: the rollback
    builder.read_until("host_managed.detected")
    _wait_for(lambda: '/install-mode":"host"' in builder.labels()[-1])
    assert builder.process.poll() is None, "the builder stands by again, it does not exit"


def test_a_standby_builder_leaves_the_takeover_to_the_rollout(builder: Builder) -> None:
    builder.read_until("host_mode.detected")
    _wait_for(lambda: any('/install-mode":"host"' in lab for lab in builder.labels()))
    builder.set("mode", "container")  # the admin vacated DKMS
    builder.read_until("waiting for the rollout")
    _wait_for(
        lambda: '"driver.tenstorrent.com/standby-pod":"ttdrv-p-abcde"' in builder.labels()[-1]
    )
    assert '"driver.tenstorrent.com/install-mode":null' in builder.labels()[-1]
    time.sleep(0.5)  # several looks
    calls = (builder.root / "state" / "calls").read_text().split()
    assert "load" not in calls, "it must not load by itself"
    assert calls.count("detect") > 3
    # A label write when what it found changes, not one per look.
    assert len(builder.labels()) == 2, builder.labels()
    assert builder.process.poll() is None


def test_load_output_is_shown_while_the_load_runs(builder: Builder) -> None:
    builder.set("mode", "container")
    builder.read_until("cloning tt-kmd")  # before the load has finished
    assert not (builder.root / "state" / "go").exists()
    builder.set("go")
    builder.read_until('"serving"')


def test_sigterm_reaches_the_serving_agent(builder: Builder) -> None:
    builder.set("mode", "container")
    builder.set("go")
    builder.read_until('"serving"')
    builder.process.send_signal(signal.SIGTERM)
    builder.read_until("terminating")
    assert builder.process.wait(timeout=10) == 0


# The builder's script with a second between starting the agent and knowing its pid: the
# window a SIGTERM can fall into, made wide enough to hit every time.
_START = "run &\n  agent_pid=$!"
assert _START in SCRIPT
SLOW_START = SCRIPT.replace(_START, "run &\n  sleep 1\n  agent_pid=$!")


@pytest.mark.parametrize("builder", [SLOW_START], indirect=True)
def test_a_sigterm_as_the_agent_starts_reaches_it_too(builder: Builder) -> None:
    builder.set("mode", "container")
    builder.set("go")
    builder.read_until('"serving"')  # printed while the builder sleeps, before the pid is known
    builder.process.send_signal(signal.SIGTERM)
    builder.read_until("terminating")
    assert builder.process.wait(timeout=10) == 0


def test_the_agent_is_told_where_the_pause_is(builder: Builder) -> None:
    builder.read_until("host_mode.detected")
    config = (builder.root / "run" / "tt-builder" / "agent.yaml").read_text()
    assert "pauseFile: /run/tt-builder/policy/paused" in config


# The builder's script with a second between the agent's exit and the builder forgetting
# its pid, said on its output as it begins: a SIGTERM there finds no agent to pass on to.
_END = '  agent_pid="" starting=""'
assert _END in SCRIPT
SLOW_END = SCRIPT.replace(_END, f"  echo 'the agent ended'\n  sleep 1\n{_END}")


@pytest.mark.parametrize("builder", [SLOW_END], indirect=True)
def test_a_sigterm_as_the_agent_stands_down_ends_the_builder(builder: Builder) -> None:
    builder.set("mode", "container")
    builder.set("go")
    builder.read_until('"serving"')
    builder.set("mode", "host")  # DKMS is back: the agent exits 4
    builder.read_until("the agent ended")  # the builder now sleeps before forgetting it
    labels = len(builder.labels())
    builder.process.send_signal(signal.SIGTERM)
    # It ends with the agent's code instead of standing by until the kubelet kills it.
    assert builder.process.wait(timeout=10) == 4
    assert len(builder.labels()) == labels
