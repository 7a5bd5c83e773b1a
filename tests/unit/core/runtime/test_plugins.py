"""Backend discovery: the contract check, configuration, and broken backends reported, not fatal."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from kmodkit.core.cli import main as cli
from kmodkit.core.contract.backend import (
    CONTRACT_VERSION,
    Backend,
    ClusterView,
    Plan,
    Resource,
)
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.runtime import plugins
from kmodkit.core.runtime.plugins import discover
from kmodkit.core.schema.crd import MODULE_CRD, CrdSource


class Empty(BaseModel):
    pass


def _plan(body: Obj, view: ClusterView) -> Plan:
    return Plan()


def _resource(kind: str, group: str = "acme.example.com") -> Resource:
    crd = CrdSource(group, "v1", kind, f"{kind.lower()}s", Empty, Empty, "test resource")
    return Resource(crd=crd, model=Empty, plan=_plan)


def _backend(name: str, *resources: Resource, contract: int = CONTRACT_VERSION) -> Backend:
    return Backend(name=name, version="1.2.3", contract=contract, resources=resources)


GOOD = _backend("good", _resource("Widget"))
FUTURE = _backend("future", contract=CONTRACT_VERSION + 1)
RENAMED = _backend("other-name")
NOT_A_BACKEND = {"name": "dict"}
SAME_KIND = _backend("same_kind", _resource("Widget"))
MODULE_AGAIN = _backend("module_again", _resource(MODULE_CRD.kind, MODULE_CRD.group))


def _ep(name: str, target: str) -> EntryPoint:
    return EntryPoint(name, f"{__name__}:{target}", "kmodkit.backends")


def _by_name(found: list[plugins.Discovered]) -> dict[str, plugins.Discovered]:
    return {d.name: d for d in found}


def test_a_backend_for_another_contract_is_refused_naming_both_versions() -> None:
    (d,) = discover(eps=[_ep("future", "FUTURE")])
    assert d.backend is None and not d.active
    assert d.error == (
        f"{__name__}:FUTURE: ValueError: backend 'future' 1.2.3 was written for backend "
        f"contract v{CONTRACT_VERSION + 1}, this kmodkit speaks v{CONTRACT_VERSION}; "
        "install a release of the backend built for this kmodkit"
    )


def test_an_import_error_is_reported_and_the_others_still_load() -> None:
    broken = EntryPoint("broken", "acme_npu_sdk_not_installed:backend", "kmodkit.backends")
    found = _by_name(discover(eps=[broken, _ep("good", "GOOD")]))
    assert found["good"].active and found["good"].backend is GOOD
    assert found["broken"].enabled and not found["broken"].active
    assert found["broken"].error == (
        "acme_npu_sdk_not_installed:backend: ModuleNotFoundError: "
        "No module named 'acme_npu_sdk_not_installed'"
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("NOT_A_BACKEND", "entry point 'x' is a dict, not a kmodkit.sdk.Backend"),
        ("RENAMED", "entry point 'x' declares a backend named 'other-name'"),
        ("MISSING_ATTRIBUTE", "AttributeError"),
    ],
)
def test_what_is_not_a_usable_backend_says_why(target: str, message: str) -> None:
    (d,) = discover(eps=[_ep("x", target)])
    assert d.error is not None and message in d.error


def test_disabled_backends_are_listed_but_not_imported() -> None:
    broken = EntryPoint("broken", "acme_npu_sdk_not_installed:backend", "kmodkit.backends")
    found = _by_name(discover(["good"], eps=[broken, _ep("good", "GOOD")]))
    # Disabling is the remedy for a backend that breaks on import.
    assert found["broken"] == plugins.Discovered("broken", enabled=False)
    assert found["good"].active


def test_load_disabled_describes_them_without_enabling_them() -> None:
    (d,) = discover([], eps=[_ep("good", "GOOD")], load_disabled=True)
    assert d.backend is GOOD and not d.enabled and not d.active


def test_an_enabled_name_nobody_installed_is_a_failure_not_silence() -> None:
    found = _by_name(discover(["good", "goood"], eps=[_ep("good", "GOOD")]))
    assert found["goood"].error == "no such backend is installed (installed: good)"
    assert found["good"].active


def test_a_kind_already_served_is_refused_to_the_later_backend() -> None:
    found = _by_name(
        discover(
            eps=[
                _ep("good", "GOOD"),
                _ep("same_kind", "SAME_KIND"),
                _ep("module_again", "MODULE_AGAIN"),
            ]
        )
    )
    assert found["good"].active
    assert found["same_kind"].error == (
        "serves a resource already served: widgets.acme.example.com (served by good)"
    )
    assert found["module_again"].error == (
        "serves a resource already served: modules.kmodkit.io (served by the built-in engine)"
    )


def test_a_disabled_backend_claims_no_kind() -> None:
    found = _by_name(
        discover(["same_kind"], eps=[_ep("good", "GOOD"), _ep("same_kind", "SAME_KIND")])
    )
    assert found["same_kind"].active


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        _ep("good", "GOOD"),
        _ep("future", "FUTURE"),
        EntryPoint("broken", "acme_npu_sdk_not_installed:backend", "kmodkit.backends"),
    ]
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps)
    monkeypatch.delenv("KMODKIT_BACKENDS", raising=False)


def _run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli.main, list(args), env=env)


def test_backends_json_lists_everything_installed(installed: None) -> None:
    result = _run("backends", "-o", "json", "--backends", "good,broken")
    assert result.exit_code == 1, result.output  # an enabled backend cannot load
    listed = {b["name"]: b for b in json.loads(result.stdout)}
    assert listed["good"] == {
        "name": "good",
        "enabled": True,
        "version": "1.2.3",
        "description": "",
        "resources": [
            {
                "apiVersion": "acme.example.com/v1",
                "kind": "Widget",
                "plural": "widgets",
                "namespaced": True,
            }
        ],
        "error": None,
    }
    assert listed["broken"]["enabled"] and "ModuleNotFoundError" in listed["broken"]["error"]
    # Disabled, yet loaded to describe it: its contract error shows.
    assert not listed["future"]["enabled"] and "contract v2" in listed["future"]["error"]


def test_backends_table_follows_the_environment_like_run(installed: None) -> None:
    result = _run("backends", env={"KMODKIT_BACKENDS": "good", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "Widget" in rows["good"] and "yes" in rows["good"]
    assert "no" in rows["broken"] and "ModuleNotFoundError" in rows["broken"]


def test_crds_prints_only_the_enabled_backends_and_reports_broken_ones(installed: None) -> None:
    result = _run("crds", "--backends", "good,broken")
    assert result.exit_code == 0, result.output
    assert "name: widgets.acme.example.com" in result.stdout
    assert "name: modules.kmodkit.io" in result.stdout
    assert "backend broken not loaded: acme_npu_sdk_not_installed:backend" in result.stderr
    assert "future" not in result.stderr
    assert "widgets" not in _run("crds", "--backends", "future").stdout


def test_none_enables_no_backend(installed: None) -> None:
    result = _run("backends", "-o", "json", env={"KMODKIT_BACKENDS": "none"})
    assert result.exit_code == 0, result.output
    assert [b["enabled"] for b in json.loads(result.stdout)] == [False, False, False]


def test_crds_out_writes_the_enabled_backends_files(installed: None, tmp_path: Any) -> None:
    result = _run("crds", "--out", str(tmp_path), "--backends", "good")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "acme.example.com_widgets.yaml",
        "kmodkit.io_modules.yaml",
        "kmodkit.io_modules_admission-policy.yaml",
    ]
