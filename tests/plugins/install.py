"""pip-install the backend packages under tests/plugins/, as a user would install a third-party one.

Into a directory of their own, which a test puts on ``PYTHONPATH`` for the
processes it starts: installed into the venv they would become part of every
other test's operator and of ``kmodkit crds``, and the broken one is broken on
purpose.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parent


def pip_install(workdir: Path, *packages: str) -> Path:
    """Install ``packages`` (directory names under tests/plugins/); returns the site directory."""
    sources = []
    for package in packages:
        # pip builds in the source tree; a copy keeps build/ out of the repository
        # and apart between concurrent runs.
        source = workdir / "src" / package
        shutil.copytree(PLUGINS / package, source)
        sources.append(str(source))
    site = workdir / "site"
    # Offline and fast: the venv's own setuptools builds the wheels (needs setuptools>=70.1).
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--no-build-isolation", "--no-index", "--target", str(site), *sources]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}"
    return site
