"""The Helm chart's static parts: CRDs in step with the models, every value documented."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kmodkit.core.cli import crds

CHART = Path(__file__).resolve().parents[3] / "charts" / "kmodkit"


def test_chart_crds_and_admission_policies_are_the_generated_ones() -> None:
    generated = crds.chart_files()
    shipped = {
        str(p.relative_to(CHART)): p.read_text(encoding="utf-8")
        for p in [*(CHART / "crds").glob("*.yaml"), CHART / crds.ADMISSION_TEMPLATE]
    }
    stale = sorted(n for n in generated if shipped.get(n) != generated[n])
    extra = sorted(set(shipped) - set(generated))
    assert not stale and not extra, (
        f"charts/kmodkit is out of date (changed or missing: {stale}; not generated: "
        f"{extra}); run `make crds`"
    )


def test_the_chart_crds_directory_holds_only_crds() -> None:
    # Helm 4 refuses anything else there, and Helm never upgrades it.
    kinds = {
        doc["kind"]
        for path in (CHART / "crds").glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    }
    assert kinds == {"CustomResourceDefinition"}


def _values(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path, value
        if isinstance(value, dict):
            yield from _values(value, path)


def test_readme_lists_every_value_with_its_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    rows = {}
    for line in (CHART / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[1].startswith("`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    undocumented = []
    for path, value in _values(values):
        # A row for the key or for an enclosing object documents it.
        parts = path.split(".")
        if any(".".join(parts[:n]) in rows for n in range(1, len(parts) + 1)):
            continue
        if not isinstance(value, dict) or not value:
            undocumented.append(path)
    assert not undocumented, f"charts/kmodkit/README.md lacks rows for {undocumented}"
    wrong = {
        key: (default, json.dumps(value))
        for key, default in rows.items()
        for value in [_lookup(values, key)]
        if default != json.dumps(value)
    }
    assert not wrong, f"README defaults differ from values.yaml (README, values): {wrong}"


def _lookup(values: dict[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        assert isinstance(node, dict) and part in node, f"README documents unknown value {key}"
        node = node[part]
    return node
