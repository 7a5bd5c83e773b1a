"""Every host path the agent touches, resolved under one prefix.

In the loader pod the host's root filesystem is mounted somewhere (``/host``); in
tests it is a temp dir. Code never opens a host path directly: it asks a
``HostRoot`` for it, so the same logic runs against either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class HostRoot:
    root: Path

    def path(self, host_path: str | PurePosixPath) -> Path:
        """The container-visible path of an absolute host path."""
        relative = PurePosixPath(host_path)
        if not relative.is_absolute():
            raise ValueError(f"host path must be absolute, got {str(host_path)!r}")
        return self.root.joinpath(*relative.parts[1:])

    def host_view(self, container_path: Path) -> str:
        """The host's own name for a path under the root, for log lines."""
        return "/" + "/".join(container_path.relative_to(self.root).parts)

    def kernel_release(self) -> str:
        """The running kernel (``uname -r``), as the host's procfs reports it.

        A container shares the host's kernel, so ``uname`` is the fallback when
        the host's /proc is not visible under the root.
        """
        try:
            return self.path("/proc/sys/kernel/osrelease").read_text().strip()
        except FileNotFoundError:
            return os.uname().release
