"""Is the driver managed by the host (DKMS) rather than by us?

A node whose driver an admin installs with DKMS must be left alone: loading our
build over it would fight every ``apt upgrade``. Either DKMS signal is enough to
stand down; the agent manages the driver only when both are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kmodkit.agent.hostroot import HostRoot


class InstallMode(StrEnum):
    HOST = "host"
    CONTAINER = "container"


@dataclass(frozen=True)
class DkmsSignal:
    kind: str
    path: str


@dataclass(frozen=True)
class HostModeReport:
    mode: InstallMode
    signals: tuple[DkmsSignal, ...]


def detect_host_mode(host: HostRoot, dkms_modules: list[str]) -> HostModeReport:
    signals: list[DkmsSignal] = []
    for module in dkms_modules:
        state_dir = f"/var/lib/dkms/{module}"
        if host.path(state_dir).is_dir():
            signals.append(DkmsSignal("dkms-state", state_dir))
        source_root = host.path("/usr/src")
        for conf in sorted(source_root.glob(f"{module}-*/dkms.conf")):
            signals.append(DkmsSignal("dkms-source", host.host_view(conf)))
    mode = InstallMode.HOST if signals else InstallMode.CONTAINER
    return HostModeReport(mode, tuple(signals))
