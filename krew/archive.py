"""Build the archive krew installs for ``kubectl kmodkit``: ``python krew/archive.py OUT_DIR``.

It holds the launcher ``kubectl-kmodkit`` alone (the plugin itself is the kmodkit
Python package). The archive is byte-for-byte reproducible (fixed times, owners
and order, gzip without a timestamp), so the sha256 in ``krew/kmodkit.yaml`` can
be checked against a fresh build.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "kubectl-kmodkit"


def version() -> str:
    """The kmodkit package's version, as krew spells it."""
    project = tomllib.loads((HERE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    return f"v{project['project']['version']}"


def archive_name() -> str:
    return f"kubectl-kmodkit-{version()}.tar.gz"


def build(out_dir: Path) -> Path:
    """Write the archive into ``out_dir``; returns its path."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        data = LAUNCHER.read_bytes()
        info = tarfile.TarInfo(LAUNCHER.name)
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        tar.addfile(info, io.BytesIO(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / archive_name()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(tar_bytes.getvalue())
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    built = build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "dist")
    print(f"{built} sha256 {sha256(built)}")
