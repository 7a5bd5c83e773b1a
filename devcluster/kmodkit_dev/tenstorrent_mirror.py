"""What an air-gapped Tenstorrent cluster mirrors, made from the tests' stand-ins: tt-kmd's
git repository and a firmware bundle (the real node serves both, ``kmodkit_dev.realnode``).

tt-kmd here is tests/kernel/ttmod, a module named tenstorrent with one stand-in device;
each version is a tag ``ttkmd-<version>`` (the builder's naming) whose module reports that
version. A bundle is in the stand-in tt-flash's format (kmodkit_dev/stand_ins/tt_flash):
a gzipped tar whose ``manifest.json`` names the ``bundle_version`` the chips then report.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kmodkit_dev.repo import ROOT

TTMOD = ROOT / "tests" / "kernel" / "ttmod"
SOURCE_VERSION = 'MODULE_VERSION("2.0.0")'
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "kmodkit dev",
    "GIT_AUTHOR_EMAIL": "dev@kmodkit.invalid",
    "GIT_COMMITTER_NAME": "kmodkit dev",
    "GIT_COMMITTER_EMAIL": "dev@kmodkit.invalid",
}


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", *args],
        cwd=cwd,
        env={**os.environ, **GIT_IDENTITY},
        check=True,
        capture_output=True,
    )


def kmd_repository(bare: Path, versions: Sequence[str]) -> Path:
    """A bare repository at ``bare`` (replacing one there) with a tag per version."""
    source = (TTMOD / "tenstorrent.c").read_text()
    if SOURCE_VERSION not in source:
        raise ValueError(f"{TTMOD / 'tenstorrent.c'} no longer has {SOURCE_VERSION}")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) / "tt-kmd"
        work.mkdir()
        _git(work, "init", "-q", "-b", "main")
        shutil.copy(TTMOD / "Kbuild", work / "Kbuild")
        for version in versions:
            (work / "tenstorrent.c").write_text(
                source.replace(SOURCE_VERSION, f'MODULE_VERSION("{version}")')
            )
            _git(work, "add", ".")
            _git(work, "commit", "-q", "-m", f"tt-kmd {version}")
            _git(work, "tag", f"ttkmd-{version}")
        shutil.rmtree(bare, ignore_errors=True)
        _git(Path(scratch), "clone", "-q", "--bare", str(work), str(bare))
    return bare


def firmware_bundle(bundle_version: str) -> bytes:
    """A bundle whose chips report ``bundle_version`` once flashed."""
    manifest = json.dumps({"bundle_version": bundle_version}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        bundle.addfile(info, io.BytesIO(manifest))
    return buffer.getvalue()
