"""A spec carrying fields of a newer release (an operator downgrade): served, the fields
ignored and named; offline validation still calls them errors."""

from __future__ import annotations

from datetime import UTC, datetime

from kmodkit.backends.tenstorrent import driver_plan, firmware_plan
from kmodkit.backends.tenstorrent.driver_api import (
    TenstorrentDriverPolicy,
    TenstorrentDriverPolicySpec,
)
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.unknown_fields import MAX_NAMED, parse_spec
from kmodkit.backends.tenstorrent.validation import problems_of
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.nodes import NodeView

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PCI = {"feature.node.kubernetes.io/pci-1200_1e52.present": "true"}
NEWER_DRIVER_SPEC = {
    "version": "2.9.0",
    "maxSurgeNodes": 2,
    "nodeAffinity": {
        "matchLabels": {"pool": "tt"},
        "matchExpressions": [{"key": "zone", "operator": "Exists", "weight": 3}],
    },
    "upgradePolicy": {"drain": {"timeoutSeconds": 30, "skipDaemonSets": True}},
}


def _view(*nodes: NodeView) -> ClusterView:
    return ClusterView(
        nodes=list(nodes), api_groups=frozenset(), operator_namespace="ops", watched={}, owned=[]
    )


def test_unknown_fields_are_left_out_and_named_at_any_depth() -> None:
    spec, unknown = parse_spec(TenstorrentDriverPolicySpec, NEWER_DRIVER_SPEC)
    assert unknown == [
        "spec.maxSurgeNodes",
        "spec.nodeAffinity.matchExpressions[0].weight",
        "spec.upgradePolicy.drain.skipDaemonSets",
    ]
    assert spec.upgrade_policy.drain.timeout_seconds == 30  # the known ones still apply
    assert spec.selector().match_expressions is not None
    fw, fw_unknown = parse_spec(
        TenstorrentFirmwarePolicySpec,
        {"version": "19.9.0", "nodeSelector": {}, "bundleURL": "https://x/b", "canary": {}},
    )
    assert fw.bundle() == "https://x/b" and fw_unknown == ["spec.canary"]  # aliases are known


def test_a_policy_with_newer_fields_is_served_and_says_what_it_ignores() -> None:
    body = {
        "metadata": {"name": "default", "generation": 7},
        "spec": NEWER_DRIVER_SPEC,
    }
    plan = driver_plan.plan_at(body, _view(NodeView("n", {**PCI, "pool": "tt", "zone": "a"})), NOW)
    conditions = {c["type"]: c for c in plan.status["conditions"]}
    assert conditions["Ready"]["reason"] != "InvalidSpec"
    ignored = conditions["FieldsIgnored"]
    assert (ignored["status"], ignored["reason"], ignored["observedGeneration"]) == (
        "True",
        "UnknownFields",
        7,
    )
    assert "spec.maxSurgeNodes" in ignored["message"] and "ignored" in ignored["message"]
    assert plan.rollout is not None and plan.rollout.nodes == ["n"]  # a rollout goes on
    assert plan.objects, "the builder DaemonSet is kept"

    many = {**NEWER_DRIVER_SPEC, **{f"field{i}": i for i in range(MAX_NAMED + 2)}}
    plan = driver_plan.plan_at({**body, "spec": many}, _view(), NOW)
    message = next(c for c in plan.status["conditions"] if c["type"] == "FieldsIgnored")["message"]
    assert "and 5 more" in message

    known_only = driver_plan.plan_at({**body, "spec": {"version": "2.9.0", "nodeSelector": {}}},
                                     _view(), NOW)  # fmt: skip
    assert "FieldsIgnored" not in {c["type"] for c in known_only.status["conditions"]}


def test_firmware_policy_with_newer_fields_is_served() -> None:
    body = {
        "metadata": {"name": "fw", "generation": 2},
        "spec": {"version": "19.9.0", "nodeAffinity": {}, "flasher": {"retries": 3}},
    }
    plan = firmware_plan.plan_at(body, _view(NodeView("n", PCI)), NOW)
    conditions = {c["type"]: c["reason"] for c in plan.status["conditions"]}
    assert conditions["FieldsIgnored"] == "UnknownFields" and plan.rollout is not None


def test_a_wrong_known_field_is_still_invalid_and_offline_unknown_fields_are_errors() -> None:
    bad = {"metadata": {"name": "d"}, "spec": {**NEWER_DRIVER_SPEC, "version": "latest"}}
    plan = driver_plan.plan_at(bad, _view(), NOW)
    ready = next(c for c in plan.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.version" in ready["message"]
    assert plan.rollout is None
    problems = problems_of(TenstorrentDriverPolicy, {"spec": NEWER_DRIVER_SPEC})
    assert "spec.maxSurgeNodes" in {p.path for p in problems}
