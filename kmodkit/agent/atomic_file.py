"""Install a file on the host so that readers see the old or the new one, never half.

The new content is written beside the target (same directory, so same
filesystem), flushed to disk, then ``rename(2)``-d over the target, and the
directory is flushed so the rename itself survives a crash. A ``tt-smi`` run
while the agent upgrades it executes either version, and a driver requesting
firmware mid-copy never reads a truncated blob.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_CHUNK = 1 << 20


def install_file(source: Path, target: Path, mode: int) -> bool:
    """Copy ``source`` to ``target`` atomically; False when it was already identical."""
    if _same_content(source, target) and (target.stat().st_mode & 0o7777) == mode:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".new")
    try:
        with os.fdopen(fd, "wb") as out, source.open("rb") as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.rename(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return True


def _same_content(a: Path, b: Path) -> bool:
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
        with a.open("rb") as fa, b.open("rb") as fb:
            while True:
                ca, cb = fa.read(_CHUNK), fb.read(_CHUNK)
                if ca != cb:
                    return False
                if not ca:
                    return True
    except FileNotFoundError:
        return False


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
