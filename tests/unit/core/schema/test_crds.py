"""The generated CRDs: in sync with the models, structural, and CEL-cost bounded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from kmodkit.core.cli import crds
from kmodkit.core.schema.crd import SchemaError, structural_schema

CRDS_DIR = Path(__file__).resolve().parents[4] / "crds"


def _module_crd() -> dict[str, Any]:
    (crd,) = crds.generated_documents()["kmodkit.io_modules.yaml"]
    return crd


def _version() -> dict[str, Any]:
    (version,) = _module_crd()["spec"]["versions"]
    return version


def _root() -> dict[str, Any]:
    root: dict[str, Any] = _version()["schema"]["openAPIV3Schema"]
    return root


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_crds_directory_matches_the_models() -> None:
    expected = crds.generated_files()
    on_disk = {path.name: path.read_text(encoding="utf-8") for path in CRDS_DIR.glob("*.yaml")}
    assert sorted(on_disk) == sorted(expected), "run `make crds` to regenerate crds/"
    for name, text in expected.items():
        assert on_disk[name] == text, f"crds/{name} is stale; run `make crds`"


def test_names_scope_and_columns() -> None:
    crd = _module_crd()
    assert crd["metadata"]["name"] == "modules.kmodkit.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "kind": "Module",
        "listKind": "ModuleList",
        "plural": "modules",
        "singular": "module",
        "shortNames": ["kmod"],
    }
    version = _version()
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Desired",
        "Available",
        "Ready",
        "Version",
        "Age",
    ]


def test_schema_is_structural() -> None:
    for path, node in _nodes(_root()):
        assert "$ref" not in node, path
        assert "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "nullable" not in node, path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
        else:
            assert "type" in node, path


def test_int_or_string_field() -> None:
    rollout = _root()["properties"]["spec"]["properties"]["rollout"]
    max_unavailable = rollout["properties"]["maxUnavailable"]
    assert max_unavailable["x-kubernetes-int-or-string"] is True
    assert max_unavailable["default"] == 1


def test_every_string_and_list_in_spec_is_bounded() -> None:
    # The apiserver estimates CEL cost from these bounds and refuses rules
    # whose worst case is too expensive.
    for path, node in _nodes(_root()["properties"]["spec"], ".spec"):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path


def test_only_free_form_maps_are_unbounded_objects() -> None:
    for path, node in _nodes(_root()):
        if node.get("type") == "object" and "properties" not in node and path != ".metadata":
            assert node["additionalProperties"]["type"] == "string", path
            assert "maxProperties" in node, path


def test_every_cel_message_names_its_field() -> None:
    rules = [
        (path, rule)
        for path, node in _nodes(_root())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 15
    for path, rule in rules:
        subject, colon, _ = rule["message"].partition(": ")
        if not colon:
            # A rule about several fields names them all.
            fields = re.findall(r"has\(self\.(\w+)\)", rule["rule"])
            assert len(fields) >= 2 and all(f in rule["message"] for f in fields), rule
            continue
        field = subject.replace("[]", "").split(".")[-1]
        assert field in rule["rule"] or path.removesuffix("[]").endswith(field), (path, rule)


def test_root_rules_use_only_what_cel_can_see_there() -> None:
    # At the root, CEL sees metadata.name but not metadata.namespace; the
    # name-plus-namespace limit therefore lives in the admission policy.
    for rule in _root()["x-kubernetes-validations"]:
        assert "namespace" not in rule["rule"]
    policy, binding = crds.generated_documents()["kmodkit.io_modules_admission-policy.yaml"]
    (validation,) = policy["spec"]["validations"]
    assert "object.metadata.namespace" in validation["expression"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_cli_output_is_all_documents() -> None:
    from click.testing import CliRunner

    from kmodkit.core.cli.main import main

    result = CliRunner().invoke(main, ["crds"])
    assert result.exit_code == 0
    documents = list(yaml.safe_load_all(result.output))
    # The core Module and its admission policy come first, then every
    # installed backend's manifests.
    assert [doc["kind"] for doc in documents[:3]] == [
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    expected = [doc for docs in crds.generated_documents().values() for doc in docs]
    assert [d["metadata"]["name"] for d in documents] == [d["metadata"]["name"] for d in expected]


def test_cli_writes_files(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kmodkit.core.cli.main import main

    result = CliRunner().invoke(main, ["crds", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0
    assert {p.name: p.read_text() for p in (tmp_path / "out").iterdir()} == (crds.generated_files())


class _Union(BaseModel):
    value: int | list[int]


def test_unions_a_crd_cannot_express_are_refused() -> None:
    with pytest.raises(SchemaError, match="unions"):
        structural_schema(_Union)
