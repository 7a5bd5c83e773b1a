"""``kmodkit backends``, and the ``--backends`` option every command that loads backends shares.

``run``, ``crds`` and ``backends`` read the same option (and ``KMODKIT_BACKENDS``),
so what ``kmodkit backends`` lists as enabled is what the operator runs and
what ``kmodkit crds`` prints.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # loading backends is deferred to the commands that need them
    from kmodkit.core.runtime.plugins import Discovered

BACKENDS_OPTION = click.option(
    "--backends",
    envvar="KMODKIT_BACKENDS",
    default="",
    help="Comma-separated backends to enable; empty enables every installed one, 'none' none "
    "(only the built-in Module engine runs).",
)


def enabled_backends(value: str) -> set[str] | None:
    """The ``--backends`` value as a set of names; ``None`` (every backend) when empty."""
    if value.strip() == "none":
        return set()
    return {name.strip() for name in value.split(",") if name.strip()} or None


def report_failures(found: list[Discovered]) -> None:
    """One line on stderr per enabled backend that could not load."""
    for d in found:
        if d.enabled and d.error:
            click.echo(f"backend {d.name} not loaded: {d.error}", err=True)


def _to_json(d: Discovered) -> dict[str, Any]:
    backend = d.backend
    return {
        "name": d.name,
        "enabled": d.enabled,
        "version": backend.version if backend else None,
        "description": backend.description if backend else None,
        "resources": [
            {
                "apiVersion": r.api_version,
                "kind": r.crd.kind,
                "plural": r.crd.plural,
                "namespaced": r.crd.namespaced,
            }
            for r in (backend.resources if backend else ())
        ],
        "error": d.error,
    }


def _print_table(found: list[Discovered]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for column in ("Name", "Version", "Resources", "Enabled", "Error"):
        table.add_column(column, overflow="fold")
    for d in found:
        resources = d.backend.resources if d.backend else ()
        table.add_row(
            d.name,
            d.backend.version if d.backend else "-",
            ", ".join(r.crd.kind for r in resources) or "-",
            "yes" if d.enabled else "no",
            # Text, not markup: errors quote code and paths with brackets.
            Text(d.error or "", style="red"),
        )
    Console(highlight=False).print(table)


@click.command()
@BACKENDS_OPTION
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def backends(backends: str, output: str) -> None:
    """List the installed backends: version, custom resources, enabled, load errors.

    Disabled backends are loaded too, to describe them. Exits 1 when an
    enabled backend cannot load, as the operator would report it in health.
    """
    from kmodkit.core.runtime.plugins import discover

    found = discover(enabled_backends(backends), load_disabled=True)
    if output == "json":
        click.echo(json.dumps([_to_json(d) for d in found], indent=2))
    else:
        _print_table(found)
    raise SystemExit(1 if any(d.enabled and d.error for d in found) else 0)
