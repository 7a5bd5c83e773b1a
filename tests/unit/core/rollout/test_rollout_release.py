"""A node that leaves a rollout's request mid-rollout: which nodes are released, and how."""

from __future__ import annotations

from typing import Any

import pytest

from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import encode_gates
from kmodkit.core.rollout.release import (
    LEFT_FAILED,
    LEFT_MID_CHANGE,
    RELEASED,
    Action,
    departure_of,
    departures,
)

KEYS = RolloutKeys.for_policy("ttdp.fleet")
OTHER = RolloutKeys.for_policy("ttfw.fleet")
GATE = "tenstorrent.com/deploy.tt-telemetry"
NOW = 1_000_000.0


def node(
    name: str = "n1",
    state: str | None = None,
    *,
    cordoned: bool = False,
    holder: str | None = None,
    rv: str = "42",
    **annotations: str,
) -> dict[str, Any]:
    labels = {KEYS.state: state} if state else {}
    if holder is not None:
        annotations[HOLDER_ANNOTATION] = holder
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"unschedulable": True} if cordoned else {},
    }


def ours(state: str, **extra: str) -> dict[str, Any]:
    """A node the rollout cordoned, gated and claimed, in ``state``."""
    n = node(
        state=state,
        cordoned=True,
        holder=KEYS.holder_id,
        **{KEYS.cordon: "rollout", KEYS.gates: encode_gates({GATE: None}), **extra},
    )
    n["metadata"]["labels"][GATE] = "false"
    return n


@pytest.mark.parametrize(
    "state", ["required", "cordoning", "gating", "evicting", "draining", "uncordoning", "done"]
)
def test_a_node_off_the_request_is_released_with_abandons_patch_guarded(state: str) -> None:
    d = departure_of(ours(state), KEYS, NOW)
    assert d is not None and d.action is Action.RELEASE and d.reason == RELEASED
    assert d.body is not None
    meta = d.body["metadata"]
    assert meta["resourceVersion"] == "42"
    assert d.body["spec"] == {"unschedulable": None}
    assert meta["labels"] == {KEYS.state: None, GATE: None}
    assert meta["annotations"][HOLDER_ANNOTATION] is None
    assert set(meta["annotations"]) == {*KEYS.annotations(), HOLDER_ANNOTATION}
    assert "uncordoned" in d.message and f"released from {state}" in d.message


def test_swapping_before_the_marker_changed_nothing_and_is_released() -> None:
    d = departure_of(ours("swapping"), KEYS, NOW)
    assert d is not None and d.action is Action.RELEASE


@pytest.mark.parametrize(("state", "extra"), [("swapping", {KEYS.swap: "v2"}), ("validating", {})])
def test_a_node_that_leaves_during_its_change_fails_and_keeps_cordon_claim_and_gates(
    state: str, extra: dict[str, str]
) -> None:
    d = departure_of(ours(state, **extra), KEYS, NOW)
    assert d is not None and d.action is Action.FAIL and d.reason == LEFT_MID_CHANGE
    assert d.warning
    assert d.body is not None
    meta = d.body["metadata"]
    assert meta["resourceVersion"] == "42"
    assert meta["labels"] == {KEYS.state: "failed"}
    assert meta["annotations"][KEYS.swap] is None
    assert meta["annotations"][KEYS.reason] == LEFT_MID_CHANGE
    assert meta["annotations"][KEYS.since] == str(int(NOW))
    assert "spec" not in d.body  # the cordon stays
    assert HOLDER_ANNOTATION not in meta["annotations"]  # the claim stays
    assert KEYS.gates not in meta["annotations"] and GATE not in meta["labels"]


def test_a_node_mid_change_without_the_rollouts_cordon_is_released_with_a_warning() -> None:
    n = node(state="validating", holder=KEYS.holder_id, **{KEYS.target: "v2"})
    d = departure_of(n, KEYS, NOW)
    assert d is not None and d.action is Action.RELEASE and d.warning
    assert "may be incomplete" in d.message
    assert d.body is not None and "spec" not in d.body


def test_a_failed_node_under_the_rollouts_cordon_is_held_without_a_write() -> None:
    d = departure_of(ours("failed", **{KEYS.reason: "ValidationTimeout"}), KEYS, NOW)
    assert d is not None and d.action is Action.HOLD and d.reason == LEFT_FAILED
    assert d.body is None
    assert "ValidationTimeout" in d.message and "uncordon" in d.message


def test_a_failed_node_the_admin_uncordoned_or_retried_is_released() -> None:
    uncordoned = ours("failed")
    uncordoned["spec"] = {}
    d = departure_of(uncordoned, KEYS, NOW)
    assert d is not None and d.action is Action.RELEASE
    assert d.body is not None and d.body["metadata"]["labels"][GATE] is None
    # `kubectl kmodkit retry` clears only the state label: claim and cordon stay.
    retried = ours("failed")
    del retried["metadata"]["labels"][KEYS.state]
    d = departure_of(retried, KEYS, NOW)
    assert d is not None and d.action is Action.RELEASE
    assert d.body is not None and d.body["spec"] == {"unschedulable": None}
    assert d.body["metadata"]["annotations"][HOLDER_ANNOTATION] is None


def test_an_admins_cordon_and_another_rollouts_claim_are_never_touched() -> None:
    n = node(state="draining", cordoned=True, holder=OTHER.holder_id, **{KEYS.cordon: "external"})
    d = departure_of(n, KEYS, NOW)
    assert d is not None and d.action is Action.RELEASE and d.body is not None
    assert "spec" not in d.body
    assert HOLDER_ANNOTATION not in d.body["metadata"]["annotations"]
    assert "uncordoned" not in d.message


def test_only_untargeted_nodes_with_this_rollouts_marks_depart() -> None:
    nodes = [
        ours("draining") | {"metadata": {**ours("draining")["metadata"], "name": "in"}},
        node("clean"),
        node("theirs", holder=OTHER.holder_id, **{OTHER.cordon: "rollout"}),
        node("left", "gating", cordoned=True, holder=KEYS.holder_id, **{KEYS.cordon: "rollout"}),
    ]
    found = departures(nodes, {"in"}, KEYS, NOW)
    assert [d.node for d in found] == ["left"]
