"""The Tenstorrent builder's entrypoint never reloads tt-kmd unless the rollout has its node.

The script runs for real; ``curl`` (the API server) and ``kmodkit-agent`` (the kernel side) are
stand-ins on PATH that record their calls, and the host's /sys is a directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "dockerfiles/tenstorrent/builder/tt-builder"
STATE = "rollout.kmodkit.io/ttdp.p"
FAKE_CURL = """#!/bin/sh
printf '%s\\n' "$*" >>"$FAKE_DIR/curl.log"
cat "$FAKE_DIR/node.json"
"""
FAKE_AGENT = """#!/bin/sh
printf '%s\\n' "$*" >>"$FAKE_DIR/agent.log"
"""


class Host:
    def __init__(self, tmp: Path, loaded: str | None) -> None:
        self.dir = tmp
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name, text in (("curl", FAKE_CURL), ("kmodkit-agent", FAKE_AGENT)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        if loaded is not None:
            module = tmp / "host/sys/module/tenstorrent"
            module.mkdir(parents=True)
            (module / "version").write_text(loaded + "\n")
        (tmp / "host").mkdir(exist_ok=True)
        self.state(None)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_DIR": str(tmp),
            "TT_KMD_VERSION": "2.9.0",
            "NODE_NAME": "n1",
            "POD_NAME": "ttdrv-p-abcde",
            "TT_ROLLOUT_STATE_LABEL": STATE,
            "TT_ROLLOUT_WAIT_SECONDS": "0.1",
            "TT_RUN_DIR": str(tmp / "run"),
            "KMODKIT_HOST_ROOT": str(tmp / "host"),
        }

    def state(self, value: str | None) -> None:
        labels = {STATE: value} if value else {}
        (self.dir / "node.json").write_text(json.dumps({"metadata": {"labels": labels}}))

    def start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["sh", str(SCRIPT)], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def agent_calls(self) -> list[str]:
        log = self.dir / "agent.log"
        return [line.split()[-1] for line in log.read_text().splitlines()] if log.exists() else []

    def patches(self) -> list[str]:
        log = self.dir / "curl.log"
        return [line for line in log.read_text().splitlines() if "PATCH" in line]


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=60)  # a loaded machine starts python3 slowly
    assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize("state", ["swapping", "validating"])
def test_another_loaded_version_waits_for_the_rollout(tmp_path: Path, state: str) -> None:
    host = Host(tmp_path, loaded="2.8.0")
    proc = host.start()
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "the builder waits"
        assert host.agent_calls() == ["detect"], "nothing loaded while the rollout is elsewhere"
        assert any('"driver.tenstorrent.com/kmd-version":"2.8.0"' in p for p in host.patches())
        host.state("required")
        time.sleep(3)  # several looks (each starts a python3 to read the answer)
        assert host.agent_calls() == ["detect"], "waiting for a slot is not the swap"
        host.state(state)
        _finish(proc)
    finally:
        proc.kill()
    assert host.agent_calls() == ["detect", "load", "run"]


@pytest.mark.parametrize("loaded", [None, "2.9.0"])
def test_nothing_or_the_same_version_loaded_goes_on_at_once(
    tmp_path: Path, loaded: str | None
) -> None:
    host = Host(tmp_path, loaded=loaded)
    proc = host.start()
    try:
        _finish(proc)
    finally:
        proc.kill()
    assert host.agent_calls() == ["detect", "load", "run"]
