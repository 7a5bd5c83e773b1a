"""File reading and terminal output behind the offline ``kmodkit`` commands.

Kept apart from ``kmodkit.core.cli.main`` so the command definitions stay a thin layer and
these helpers can be imported without click's decorators running.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import click
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kmodkit.core.api import Module
from kmodkit.core.cli.preflight import PreflightResult
from kmodkit.core.engine.module_rules import register_module_validators, validate_module
from kmodkit.core.schema.validation import ValidatorRegistry


def build_registry() -> ValidatorRegistry:
    """A registry with every kind the offline commands can validate.

    The Module, and every resource of an installed backend that declares a
    validator.
    """
    from kmodkit.core.runtime.plugins import discover

    registry = ValidatorRegistry()
    register_module_validators(registry)
    for found in discover():
        for resource in found.backend.resources if found.backend else ():
            if resource.validate is not None:
                registry.register(resource.api_version, resource.crd.kind, resource.validate)
    return registry


def _read(filename: str) -> str:
    if filename == "-":
        return sys.stdin.read()
    with open(filename, encoding="utf-8") as handle:
        return handle.read()


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    raise SystemExit(2)


def load_objects(filename: str, namespace: str) -> Iterator[tuple[int, object]]:
    """(index, object) for each non-empty YAML document in ``filename``.

    Objects without ``metadata.namespace`` get ``namespace``, as ``kubectl``
    would give them the context's. Unreadable YAML exits 2.
    """
    try:
        documents = list(yaml.safe_load_all(_read(filename)))
    except (OSError, yaml.YAMLError) as err:
        _fail(f"{filename}: cannot read YAML: {err}")
    for index, document in enumerate(documents):
        if document is None:
            continue
        yield index, _with_namespace(document, namespace)


def _with_namespace(document: object, namespace: str) -> object:
    if not isinstance(document, Mapping):
        return document
    filled: dict[str, Any] = copy.deepcopy(dict(document))
    metadata = filled.get("metadata")
    if metadata is None:
        filled["metadata"] = {"namespace": namespace}
    elif isinstance(metadata, dict) and not metadata.get("namespace"):
        metadata["namespace"] = namespace
    return filled


def object_label(obj: object, index: int) -> str:
    """``<kind>/<name>`` for messages, or the document's position if unnamed."""
    if not isinstance(obj, Mapping):
        return f"document {index + 1}"
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return f"{obj.get('kind') or '?'}/{name or f'(document {index + 1})'}"


def load_module(filename: str, namespace: str) -> Module:
    """The one Module in ``filename``; exits 2 if there is not exactly one valid Module."""
    modules: list[tuple[int, Mapping[str, Any]]] = []
    for index, obj in load_objects(filename, namespace):
        if isinstance(obj, Mapping) and obj.get("kind") == "Module":
            modules.append((index, obj))
    if len(modules) != 1:
        _fail(f"{filename}: holds {len(modules)} Modules; give a file with exactly one")
    index, obj = modules[0]
    problems = validate_module(obj)
    if problems:
        label = object_label(obj, index)
        _fail("\n".join(f"{filename}: {label}: {p.path}: {p.message}" for p in problems))
    return Module.model_validate(obj)


def print_preflight_table(module: Module, results: list[PreflightResult]) -> None:
    """Preflight results as a table on the terminal."""
    table = Table(title=f"Module {module.metadata.namespace}/{module.metadata.name}")
    for column in ("Kernel", "Mapping", "Image", "Build", "Result"):
        table.add_column(column, overflow="fold")
    for result in results:
        # Text, not markup: messages hold field paths such as "kernelMappings[2]".
        if result.error:
            outcome = Text(result.error, style="red")
        elif result.matched:
            outcome = Text("ok", style="green")
        else:
            outcome = Text("no mapping matches", style="yellow")
        table.add_row(
            result.kernel,
            "-" if result.mapping_index is None else str(result.mapping_index),
            result.container_image or "-",
            "yes" if result.build else "no",
            outcome,
        )
    Console(highlight=False).print(table)
