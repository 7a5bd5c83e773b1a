"""Rollout keys fit Kubernetes' limits; policies refuse what would fail mid-rollout."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.keys import RolloutKeys, scope_for
from kmodkit.core.rollout.observed import NodeRecord, NodeView
from kmodkit.core.rollout.plan import Context, plan
from kmodkit.core.rollout.states import State
from kmodkit.core.rollout.status import MAX_NODES, summarize
from kmodkit.core.selectors import is_label_key


def test_a_short_policy_id_is_used_as_is_and_readable() -> None:
    keys = RolloutKeys.for_policy("ttdp.default")
    assert keys.state == "rollout.kmodkit.io/ttdp.default"
    assert keys.cordon == "rollout.kmodkit.io/ttdp.default.cordon"


@pytest.mark.parametrize(
    "policy_id",
    ["x" * 200, "TenstorrentFirmwarePolicy/Default", "ns/name with spaces", "-", "a" * 54],
)
def test_every_key_is_a_valid_label_key(policy_id: str) -> None:
    keys = RolloutKeys.for_policy(policy_id)
    for key in (keys.state, *keys.annotations()):
        assert is_label_key(key), key
        assert len(key.partition("/")[2]) <= 63


def test_different_ids_that_shorten_alike_get_different_keys() -> None:
    assert scope_for("a" * 80 + "1") != scope_for("a" * 80 + "2")
    assert scope_for("Fw/Default") != scope_for("fw-default")


def test_policy_defaults_are_conservative() -> None:
    policy = UpgradePolicy()
    assert policy.max_parallel == 1
    assert policy.halt_on_failure
    assert not policy.drain.enable


def test_policy_reads_camel_case_as_a_custom_resource_carries_it() -> None:
    policy = UpgradePolicy.model_validate(
        {
            "maxParallel": 3,
            "maxUnavailable": "50%",
            "deployGates": {"tenstorrent.com/deploy.tt-telemetry": "false"},
            "drain": {"enable": True, "podSelector": "app notin (infra)", "deleteEmptyDir": True},
            "deviceEviction": {"timeoutSeconds": 30},
        }
    )
    assert policy.max_unavailable_nodes(5) == 3
    assert policy.to_wire()["drain"]["podSelector"] == "app notin (infra)"


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("maxUnavailable", 0, "at least 1"),
        ("maxUnavailable", "150%", "percentage"),
        ("maxParallel", 0, "greater than or equal to 1"),
        ("deployGates", {"bad key!": "false"}, "not a valid node label key"),
        ("drain", {"podSelector": "app in a,b"}, "not a label requirement"),
    ],
)
def test_bad_policies_are_refused_naming_the_problem(
    field: str, value: object, complaint: str
) -> None:
    with pytest.raises(ValidationError) as err:
        UpgradePolicy.model_validate({field: value})
    assert complaint in str(err.value)


@pytest.mark.parametrize(
    "selector", ["", "app=web", "app==web,tier!=db", "!batch", "k8s.io/x in (a, b)", "x notin ()"]
)
def test_valid_selectors_are_accepted(selector: str) -> None:
    policy = UpgradePolicy.model_validate({"drain": {"podSelector": selector}})
    assert policy.drain.pod_selector == selector


def test_status_counts_every_node_but_details_a_bounded_number() -> None:
    views = [
        NodeView(name=f"n{i:04}", state=State.FAILED, record=NodeRecord(target="v"))
        for i in range(MAX_NODES + 50)
    ]
    views += [NodeView(name="ok", state=State.DONE, needs_update=False)]
    p = plan(views, Context(UpgradePolicy(), RolloutKeys.for_policy("p"), "v", 0.0))
    status = summarize(views, p, p.steps)
    assert status.summary.failed == MAX_NODES + 50
    assert status.summary.up_to_date == 1
    assert len(status.nodes) == MAX_NODES and status.nodes_omitted == 50
    assert status.nodes_by_state == {"done": 1, "failed": MAX_NODES + 50}
    assert status.halted and not status.complete
    assert "nodesByState" in status.to_wire()


def test_status_says_why_required_nodes_wait() -> None:
    views = [NodeView(name="a", state=State.REQUIRED, needs_update=True)]
    p = plan(views, Context(UpgradePolicy(), RolloutKeys.for_policy("p"), "v", 0.0, paused=True))
    [node] = summarize(views, p, p.steps).nodes
    assert (node.state, node.reason) == ("required", "Paused")
