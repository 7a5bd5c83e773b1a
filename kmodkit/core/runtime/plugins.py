"""Discover backends through the ``kmodkit.backends`` entry-point group.

Which backends run is configuration: a set of entry-point names, ``None`` for
every installed one. A disabled backend is not even imported, so disabling is
also the remedy for one that breaks on import. A backend that fails to
import, is not a Backend, was written for another contract version, or
claims a custom resource another one already serves is reported with the
reason and skipped; the others load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points

from kmodkit.core.contract.backend import CONTRACT_VERSION, ENTRY_POINT_GROUP, Backend
from kmodkit.core.schema.crd import MODULE_CRD


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
            f"entry point {name!r} is a {type(obj).__name__}, not a kmodkit.sdk.Backend"
        )
    if obj.contract != CONTRACT_VERSION:
        raise ValueError(
            f"backend {name!r} {obj.version} was written for backend contract "
            f"v{obj.contract}, this kmodkit speaks v{CONTRACT_VERSION}; install a "
            "release of the backend built for this kmodkit"
        )
    if obj.name != name:
        # Configuration (KMODKIT_BACKENDS) and health use the entry-point name.
        raise ValueError(f"entry point {name!r} declares a backend named {obj.name!r}")
    return obj


def _load(ep: EntryPoint, enabled: bool, load_disabled: bool) -> Discovered:
    if not (enabled or load_disabled):
        return Discovered(ep.name, enabled)
    try:
        return Discovered(ep.name, enabled, backend=check(ep.name, ep.load()))
    except Exception as e:  # a broken plugin must not stop the others
        return Discovered(ep.name, enabled, error=f"{ep.value}: {type(e).__name__}: {e}")


def _one_owner_per_kind(found: list[Discovered]) -> list[Discovered]:
    # Two controllers for one kind would fight over its objects' status and
    # owned objects; the first enabled backend by name keeps it.
    owners = {f"{MODULE_CRD.plural}.{MODULE_CRD.group}": "the built-in engine"}
    result = []
    for d in found:
        resources = d.backend.resources if d.enabled and d.backend else ()
        kinds = [f"{r.crd.plural}.{r.crd.group}" for r in resources]
        taken = [f"{kind} (served by {owners[kind]})" for kind in kinds if kind in owners]
        if taken:
            d = replace(d, backend=None, error=f"serves a resource already served: {taken[0]}")
        else:
            owners.update(dict.fromkeys(kinds, d.name))
        result.append(d)
    return result


def discover(
    enabled: Iterable[str] | None = None,
    eps: Iterable[EntryPoint] | None = None,
    load_disabled: bool = False,
) -> list[Discovered]:
    """Every installed backend, loaded when enabled (``None`` enables all).

    ``load_disabled`` loads the disabled ones too, to describe them. An enabled
    name that no installed backend has is reported as failed, so a typo in the
    configuration shows in health rather than silently running less.
    """
    wanted = None if enabled is None else set(enabled)
    found = list(entry_points(group=ENTRY_POINT_GROUP) if eps is None else eps)
    installed = sorted(ep.name for ep in found)
    listed = [_load(ep, wanted is None or ep.name in wanted, load_disabled) for ep in found]
    listed += [
        Discovered(
            name,
            True,
            error=f"no such backend is installed (installed: {', '.join(installed) or 'none'})",
        )
        for name in sorted((wanted or set()) - set(installed))
    ]
    return _one_owner_per_kind(sorted(listed, key=lambda d: d.name))
