"""The kinds ``kubectl kmodkit`` knows, and how a user's ``KIND/NAME`` picks one object."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import click

from kmodkit.core.contract.backend import RolloutControls
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.schema.crd import MODULE_CRD, CrdSource


@dataclass(frozen=True)
class Kind:
    crd: CrdSource
    engine: str
    """Shown when the object's status does not say which engine serves it."""
    controls: RolloutControls | None = None

    @property
    def names(self) -> frozenset[str]:
        """Every word ``kubectl get`` accepts for the kind, lower-case."""
        c = self.crd
        return frozenset(
            {c.kind.lower(), c.plural, f"{c.plural}.{c.group}", *(s.lower() for s in c.short_names)}
        )

    @property
    def short(self) -> str:
        return self.crd.short_names[0] if self.crd.short_names else self.crd.kind


def kinds() -> list[Kind]:
    """The built-in Module and every installed backend's resources."""
    from kmodkit.core.runtime.plugins import discover

    found = [Kind(MODULE_CRD, "kmodkit")]
    for d in discover():
        if d.backend is not None:
            found += [Kind(r.crd, d.name, r.controls) for r in d.backend.resources]
    return found


def split_ref(ref: str) -> tuple[str | None, str]:
    """``KIND/NAME`` or ``NAME``."""
    kind, slash, name = ref.rpartition("/")
    if slash and (not kind or not name):
        raise click.UsageError(f"{ref!r} is neither NAME nor KIND/NAME")
    return (kind or None), name


def kinds_named(word: str | None, known: Sequence[Kind]) -> list[Kind]:
    """The kinds ``word`` names (every kind when None)."""
    if word is None:
        return list(known)
    found = [k for k in known if word.lower() in k.names]
    if not found:
        choices = ", ".join(f"{k.crd.kind} ({k.short})" for k in known)
        raise click.UsageError(f"no kind {word!r} here; one of: {choices}")
    return found


def pick(ref: str, found: Sequence[tuple[Kind, Obj]]) -> tuple[Kind, Obj]:
    """The one object ``ref`` names among those found under its name."""
    if len(found) == 1:
        return found[0]
    _, name = split_ref(ref)
    if not found:
        raise click.ClickException(
            f"no Module or policy named {name!r} (kubectl kmodkit status lists them)"
        )
    which = ", ".join(f"{k.short}/{name}" for k, _ in found)
    raise click.ClickException(f"{name!r} names more than one object; say which: {which}")
