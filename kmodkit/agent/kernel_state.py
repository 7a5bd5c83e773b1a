"""What the running kernel has loaded, read from procfs and sysfs.

Readiness and every load/unload decision start here, never from a stamp file
the agent wrote earlier: a node reboot, a manual rmmod or a DKMS reinstall all
change the truth behind the agent's back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from kmodkit.agent.hostroot import HostRoot


def kernel_name(module: str) -> str:
    """The name the kernel uses: modprobe accepts ``-`` but sysfs shows ``_``."""
    return module.replace("-", "_")


@dataclass(frozen=True)
class ProcModule:
    name: str
    refcnt: int
    used_by: tuple[str, ...]
    state: str


def parse_proc_modules(text: str) -> dict[str, ProcModule]:
    """Parse ``/proc/modules``: ``name size refcnt used_by state address [taints]``."""
    modules: dict[str, ProcModule] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        name, _size, refcnt, used_by, state = fields[:5]
        users = tuple(u for u in used_by.split(",") if u and u != "-")
        modules[name] = ProcModule(name, int(refcnt) if refcnt.isdigit() else 0, users, state)
    return modules


def parse_modules_builtin(text: str) -> frozenset[str]:
    """Module names from ``modules.builtin`` lines like ``kernel/drivers/x/foo-bar.ko``."""
    names = set()
    for line in text.splitlines():
        base = line.strip().rsplit("/", 1)[-1]
        if base.endswith(".ko"):
            names.add(kernel_name(base.removesuffix(".ko")))
    return frozenset(names)


class Presence(StrEnum):
    LOADED = "loaded"
    BUILTIN = "builtin"
    ABSENT = "absent"


@dataclass(frozen=True)
class ModuleObservation:
    name: str
    presence: Presence
    initstate: str | None = None
    refcnt: int = 0
    version: str | None = None
    used_by: tuple[str, ...] = ()
    # The kernel taints itself with "O" for each out-of-tree module it loads;
    # this tells our driver apart from an in-tree module of the same name.
    out_of_tree: bool = False
    srcversion: str | None = None
    """A checksum of the module's sources: tells two builds of one version apart."""

    @property
    def live(self) -> bool:
        return self.presence is Presence.LOADED and self.initstate == "live"


class KernelView:
    def __init__(self, host: HostRoot, kernel: str) -> None:
        self._host = host
        self._kernel = kernel

    def observe(self, names: Sequence[str]) -> dict[str, ModuleObservation]:
        proc = parse_proc_modules(_read(self._host.path("/proc/modules")) or "")
        builtin = parse_modules_builtin(
            _read(self._host.path(f"/lib/modules/{self._kernel}/modules.builtin")) or ""
        )
        return {name: self._observe_one(kernel_name(name), proc, builtin) for name in names}

    def _observe_one(
        self, name: str, proc: dict[str, ProcModule], builtin: frozenset[str]
    ) -> ModuleObservation:
        sysdir = self._host.path(f"/sys/module/{name}")
        version = _read(sysdir / "version")
        version = version.strip() if version is not None else None
        if name in proc:
            refcnt = _read(sysdir / "refcnt")
            initstate = _read(sysdir / "initstate")
            taint = _read(sysdir / "taint") or ""
            srcversion = _read(sysdir / "srcversion")
            return ModuleObservation(
                name=name,
                presence=Presence.LOADED,
                initstate=initstate.strip() if initstate is not None else None,
                refcnt=int(refcnt) if refcnt is not None else proc[name].refcnt,
                version=version,
                srcversion=srcversion.strip() if srcversion is not None else None,
                used_by=proc[name].used_by,
                out_of_tree="O" in taint,
            )
        # A built-in module has no /proc/modules line and no initstate, but may
        # still have a /sys/module directory for its parameters.
        if name in builtin or (sysdir.is_dir() and not (sysdir / "initstate").exists()):
            return ModuleObservation(name=name, presence=Presence.BUILTIN, version=version)
        return ModuleObservation(name=name, presence=Presence.ABSENT)


# What a driver's sysfs directory holds besides its bound devices.
_DRIVER_ATTRIBUTES = frozenset({"bind", "unbind", "new_id", "remove_id", "uevent", "module"})


def bound_devices(host: HostRoot, module: str) -> list[tuple[str, str, str]]:
    """(bus, driver, device) of every device bound to one of ``module``'s drivers.

    A GPU driver with bound devices may refuse to go (Intel documents this for xe);
    naming them, and how to unbind them, is what the admin needs next."""
    found = []
    drivers = host.path(f"/sys/module/{kernel_name(module)}/drivers")
    for link in sorted(drivers.iterdir()) if drivers.is_dir() else []:
        bus, _, driver = link.name.partition(":")
        directory = host.path(f"/sys/bus/{bus}/drivers/{driver}")
        if not driver or not directory.is_dir():
            continue
        found += [
            (bus, driver, entry.name)
            for entry in sorted(directory.iterdir())
            if entry.is_symlink() and entry.name not in _DRIVER_ATTRIBUTES
        ]
    return found


def describe_bound(devices: Sequence[tuple[str, str, str]]) -> str:
    """`` ; bound devices: …`` with the unbind command for each, or nothing."""
    if not devices:
        return ""
    return "; bound devices: " + ", ".join(
        f"{device} ({bus} driver {driver}; to unbind: "
        f"echo {device} > /sys/bus/{bus}/drivers/{driver}/unbind)"
        for bus, driver, device in devices
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
