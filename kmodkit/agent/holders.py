"""Which processes hold a driver's device files open.

A module's refcount says *that* it is busy; ``/proc/<pid>/fd`` says *who*. The
holders are named in the refusal so an operator can act, and with force-unload
they are the exact set of processes killed: nothing else on the node.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from kmodkit.agent.hostroot import HostRoot


@dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    cmdline: str
    devices: tuple[str, ...]

    def as_log(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "comm": self.comm,
            "cmdline": self.cmdline,
            "devices": list(self.devices),
        }


def find_holders(host: HostRoot, device_globs: list[str]) -> list[Holder]:
    """Processes with an fd whose link target matches one of ``device_globs``.

    Link targets are the names the holder opened, in its own mount namespace;
    container runtimes bind the host's device nodes at the same paths, so
    ``/dev/tenstorrent/0`` matches whichever container holds it. Needs the
    host's PID namespace (``hostPID``) to see other pods' processes.
    """
    if not device_globs:
        return []
    holders: list[Holder] = []
    for pid_dir in _pid_dirs(host.path("/proc")):
        devices = sorted({t for t in _fd_targets(pid_dir) if _matches(t, device_globs)})
        if devices:
            holders.append(
                Holder(
                    pid=int(pid_dir.name),
                    comm=_read(pid_dir / "comm").strip(),
                    cmdline=_read(pid_dir / "cmdline").replace("\0", " ").strip(),
                    devices=tuple(devices),
                )
            )
    return sorted(holders, key=lambda h: h.pid)


def _pid_dirs(proc: Path) -> list[Path]:
    try:
        with os.scandir(proc) as entries:
            return [Path(e.path) for e in entries if e.name.isdigit()]
    except FileNotFoundError:
        return []


def _fd_targets(pid_dir: Path) -> list[str]:
    targets: list[str] = []
    try:
        with os.scandir(pid_dir / "fd") as fds:
            for fd in fds:
                try:
                    targets.append(os.readlink(fd.path))
                except OSError:
                    continue  # the fd closed between listing and reading
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        pass  # the process exited, or is one we may not inspect
    return targets


def _matches(target: str, globs: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(target, pattern) for pattern in globs)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
