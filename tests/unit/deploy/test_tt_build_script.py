"""The builder image's ``build-tt-kmd``, run for real with a stand-in ``git`` on PATH.

The stand-in is a clone that never answers (what a proxy that swallows the
connection looks like): the script must give up at its clone timeout and say why.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "dockerfiles/tenstorrent/builder/build-tt-kmd"


def test_a_hung_clone_times_out_with_a_reason(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    git = bin_dir / "git"
    git.write_text("#!/bin/sh\nexec sleep 600\n")
    git.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KMODKIT_VERSION": "2.9.0",
        "KMODKIT_KERNEL_VERSION": "6.8.0-45-generic",
        "KMODKIT_OUTPUT_DIR": str(tmp_path / "out"),
        "TT_CLONE_TIMEOUT_SECONDS": "1",
    }
    started = time.monotonic()
    run = subprocess.run(
        ["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert time.monotonic() - started < 15
    assert run.returncode == 1
    assert "cloning https://github.com/tenstorrent/tt-kmd.git at ttkmd-2.9.0" in run.stdout
    assert "did not finish in 1s" in run.stderr
    assert "HTTPS_PROXY" in run.stderr
