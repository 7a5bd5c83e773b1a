"""Firmware files from the driver image, placed where the host kernel looks.

Files go in before the module loads, because a driver requests its firmware
during probe. The kernel searches a fixed list of directories plus one custom
path (``firmware_class.path``); a host directory outside the fixed list, such as
``/var/lib/firmware`` on hosts with a read-only ``/lib``, is set as that path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kmodkit.agent.atomic_file import install_file
from kmodkit.agent.hostroot import HostRoot

CLASS_PATH_PARAMETER = "/sys/module/firmware_class/parameters/path"


def kernel_searches(host_dir: str, kernel: str) -> bool:
    """True when the kernel already looks in ``host_dir`` without a custom path."""
    builtin = {
        "/lib/firmware/updates/" + kernel,
        "/lib/firmware/updates",
        "/lib/firmware/" + kernel,
        "/lib/firmware",
    }
    return str(PurePosixPath(host_dir)) in builtin


@dataclass(frozen=True)
class PlacedFirmware:
    installed: tuple[str, ...]
    unchanged: tuple[str, ...]
    # firmware_class.path matters only for a host dir outside the built-in list;
    # before is None there when the host has no such parameter to set.
    class_path_needed: bool
    class_path_before: str | None
    class_path_set: bool


def image_files(image_dir: Path) -> list[Path]:
    """The firmware files an image ships, relative to its firmware directory."""
    return sorted(p.relative_to(image_dir) for p in image_dir.rglob("*") if p.is_file())


def place_firmware(host: HostRoot, image_dir: Path, host_dir: str, kernel: str) -> PlacedFirmware:
    installed: list[str] = []
    unchanged: list[str] = []
    for relative in image_files(image_dir):
        source = image_dir / relative
        target = host.path(host_dir) / relative
        changed = install_file(source, target, source.stat().st_mode & 0o777)
        (installed if changed else unchanged).append(host.host_view(target))
    before: str | None = None
    class_path_set = False
    class_path_needed = not kernel_searches(host_dir, kernel)
    if class_path_needed:
        parameter = host.path(CLASS_PATH_PARAMETER)
        if parameter.exists():
            before = parameter.read_text().strip()
            if before != host_dir:
                parameter.write_text(host_dir)
                class_path_set = True
    return PlacedFirmware(
        tuple(installed), tuple(unchanged), class_path_needed, before, class_path_set
    )


def remove_firmware(host: HostRoot, image_dir: Path, host_dir: str) -> list[str]:
    """Remove the files this image placed; directories stay, as other drivers may share them."""
    removed: list[str] = []
    for relative in image_files(image_dir):
        target = host.path(host_dir) / relative
        if target.is_file():
            target.unlink()
            removed.append(host.host_view(target))
    return removed
