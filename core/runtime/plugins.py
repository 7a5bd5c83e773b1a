"""Discover backends through the ``kmodkit.backends`` entry-point group.

A backend that fails to import, is not a Backend, or was written for another
contract version is reported with the reason and skipped; the others load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from core.backend import CONTRACT_VERSION, ENTRY_POINT_GROUP, Backend


@dataclass(frozen=True)
class Discovered:
    name: str
    enabled: bool
    backend: Backend | None = None
    error: str | None = None

    @property
    def active(self) -> bool:
        return self.enabled and self.backend is not None


def check(name: str, obj: object) -> Backend:
    """Return ``obj`` as a Backend, or raise ValueError saying what is wrong with it."""
    if not isinstance(obj, Backend):
        raise ValueError(
            f"entry point {name!r} is a {type(obj).__name__}, not a core.backend.Backend"
        )
    if obj.contract != CONTRACT_VERSION:
        raise ValueError(
            f"backend {name!r} {obj.version} was written for backend contract "
            f"v{obj.contract}, this kmodkit speaks v{CONTRACT_VERSION}; install a "
            "release of the backend built for this kmodkit"
        )
    return obj


def _load(ep: EntryPoint, enabled: bool) -> Discovered:
    if not enabled:
        return Discovered(ep.name, enabled=False)
    try:
        return Discovered(ep.name, True, backend=check(ep.name, ep.load()))
    except Exception as e:  # a broken plugin must not stop the others
        return Discovered(ep.name, True, error=f"{type(e).__name__}: {e}")


def discover(
    enabled: Iterable[str] | None = None, eps: Iterable[EntryPoint] | None = None
) -> list[Discovered]:
    """Every installed backend, loaded when enabled (``None`` enables all)."""
    wanted = None if enabled is None else set(enabled)
    found = entry_points(group=ENTRY_POINT_GROUP) if eps is None else eps
    return sorted(
        (_load(ep, wanted is None or ep.name in wanted) for ep in found), key=lambda d: d.name
    )
