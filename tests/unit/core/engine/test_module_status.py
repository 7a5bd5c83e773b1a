"""A Module's status as the engine writes it (counters and conditions are covered with the
loader plan and the status schema test); here: the rebuild trigger KMM's status echoes."""

from __future__ import annotations

from typing import Any

from kmodkit.core.engine.loader_plan import plan
from kmodkit.core.engine.module_status import module_status
from tests.unit.core.engine import test_loader_plan as loader

KEY = "imageRebuildTriggerGeneration"


def status(spec: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    m = loader.module()
    body = {**m.to_wire(), "spec": {**m.to_wire()["spec"], **spec}}
    if old is not None:
        body["status"] = old
    a = loader.node("a")
    return module_status(body, plan(m, [a], [], loader.all_exist(m, [a]), loader.SETTINGS))


def test_status_echoes_the_rebuild_trigger_the_pass_acted_on() -> None:
    assert status({KEY: 3})[KEY] == 3
    assert status({KEY: 4}, old={KEY: 3})[KEY] == 4


def test_no_trigger_no_field_and_a_removed_trigger_is_cleared_once() -> None:
    assert KEY not in status({})
    # A merge patch removes a key written as null; after that the key is left out.
    cleared = status({}, old={KEY: 3})
    assert KEY in cleared and cleared[KEY] is None
    assert KEY not in status({}, old={"conditions": []})


def test_an_invalid_module_does_not_claim_its_trigger_applied() -> None:
    m = loader.module()
    body = {**m.to_wire(), "spec": {**m.to_wire()["spec"], KEY: 3}}
    assert KEY not in module_status(body, plan(m, [], [], {}, loader.SETTINGS), invalid="bad")


def test_a_node_no_mapping_serves_is_not_desired_nor_a_failure() -> None:
    # As KMM: desiredNumber counts the nodes that should run the module.
    m = loader.module()
    mapped, unmapped = loader.node("a"), loader.node("rhel", "5.14.0-427.el9.x86_64")
    nodes = [mapped, unmapped]
    result = plan(
        m, nodes, [loader.running(m, mapped)], loader.all_exist(m, nodes), loader.SETTINGS
    )
    got = module_status(m.to_wire(), result)
    assert got["moduleLoader"] == {
        "nodesMatchingSelectorNumber": 2,
        "desiredNumber": 1,
        "availableNumber": 1,
        "readyNumber": 1,
    }
    conditions = {c["type"]: c for c in got["conditions"]}
    assert conditions["Degraded"]["status"] == "False"
    assert conditions["Ready"]["status"] == "True"
    assert "1 selected nodes have no kernel mapping" in conditions["Ready"]["message"]
    assert got["nodeFailures"] == []
    assert got["unmappedNodes"] == [{"node": "rhel", "kernel": "5.14.0-427.el9.x86_64"}]
