"""One node, one policy of a kind: the oldest covering policy owns it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kmodkit.backends.tenstorrent import firmware_plan
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicyStatus
from kmodkit.backends.tenstorrent.node_owners import Claim, owners
from kmodkit.backends.tenstorrent.selection import NodeLabelSelector
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.nodes import NodeView

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PCI = {"feature.node.kubernetes.io/pci-1200_1e52.present": "true"}


def _node(name: str, **labels: str) -> NodeView:
    return NodeView(name=name, labels={**PCI, **labels}, ready=True)


def _claim(name: str, created: str, **match: str) -> Claim:
    return Claim(name, created, NodeLabelSelector(match_labels=match or None))


def test_the_oldest_covering_policy_owns_a_node_then_the_name_breaks_ties() -> None:
    nodes = [_node("shared", pool="tt"), _node("only-b", pool="b")]
    old = _claim("zeta", "2026-11-01T00:00:00Z", pool="tt")
    young = _claim("alpha", "2026-11-02T00:00:00Z")
    assert owners([old, young], nodes, True) == {"shared": "zeta", "only-b": "alpha"}
    same_a, same_b = _claim("b", "2026-11-01T00:00:00Z"), _claim("a", "2026-11-01T00:00:00Z")
    ordered = sorted([same_a, same_b], key=lambda c: (c.created, c.name))
    assert owners(ordered, nodes, True) == {"shared": "a", "only-b": "a"}
    # The owner gone, the next oldest takes the node.
    assert owners([young], nodes, True) == {"shared": "alpha", "only-b": "alpha"}


def _fw(name: str, created: str, version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": {"name": name, "generation": 1, "creationTimestamp": created},
        "spec": {"version": version, "nodeAffinity": {}, **spec},
    }


def _view(nodes: list[NodeView], policies: list[dict[str, Any]]) -> ClusterView:
    return ClusterView(
        nodes=nodes,
        api_groups=frozenset(),
        operator_namespace="ops",
        watched={firmware_plan.POLICIES: policies},
    )


def test_the_younger_firmware_policy_reports_node_conflict_and_flashes_nothing() -> None:
    older = _fw("older", "2026-11-01T00:00:00Z", "19.9.0")
    younger = _fw("younger", "2026-11-02T00:00:00Z", "19.8.0")
    nodes = [_node("shared")]
    view = _view(nodes, [older, younger])

    winner = firmware_plan.plan_at(older, view, NOW)
    assert winner.rollout is not None and winner.rollout.nodes == ["shared"]
    assert winner.status["nodes"][0]["state"] == "Pending"

    loser = firmware_plan.plan_at(younger, view, NOW)
    assert loser.rollout is not None and loser.rollout.nodes == []
    entry = loser.status["nodes"][0]
    assert (entry["state"], entry["reason"]) == ("Conflict", "NodeConflict")
    assert "older" in entry["message"]
    TenstorrentFirmwarePolicyStatus.model_validate(loser.status)  # the CRD admits the state
    assert loser.requeue_after is None
    assert loser.status["summary"]["conflicts"] == 1
    # Already in conflict at the policy's first pass: announced then, once.
    assert [(e.node, e.reason) for e in loser.events] == [("shared", "NodeConflict")]
    assert firmware_plan.plan_at({**younger, "status": loser.status}, view, NOW).events == []
    # The entry's change to NodeConflict is posted as a warning Event on the node.
    before = {"nodes": [{"name": "shared", "state": "Pending", "reason": "UpgradeRequired"}]}
    again = firmware_plan.plan_at({**younger, "status": before}, view, NOW)
    assert [(e.node, e.reason, e.warning) for e in again.events] == [
        ("shared", "NodeConflict", True)
    ]

    # The older policy deleted, the younger one rolls the node.
    alone = firmware_plan.plan_at(younger, _view(nodes, [younger]), NOW)
    assert alone.rollout is not None and alone.rollout.nodes == ["shared"]


def test_an_invalid_or_not_yet_watched_policy_does_not_change_who_owns_a_node() -> None:
    older = _fw("older", "2026-11-01T00:00:00Z", "19.9.0")
    broken = _fw("broken", "2026-10-01T00:00:00Z", "not-a-version")
    younger = _fw("younger", "2026-11-02T00:00:00Z", "19.8.0")
    nodes = [_node("shared")]
    # The watch has not seen the older policy yet: its own plan still counts it.
    first = firmware_plan.plan_at(older, _view(nodes, [broken, younger]), NOW)
    assert first.rollout is not None and first.rollout.nodes == ["shared"]
    loser = firmware_plan.plan_at(younger, _view(nodes, [broken, older, younger]), NOW)
    assert loser.rollout is not None and loser.rollout.nodes == []
