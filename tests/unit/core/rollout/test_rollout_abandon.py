"""Deleting a policy mid-rollout gives every node back what the rollout took."""

from __future__ import annotations

from kmodkit.core.rollout.abandon import abandon_patch
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.observed import encode_gates

KEYS = RolloutKeys.for_policy("ttdp/fleet")
GATE = "tenstorrent.com/deploy.tt-telemetry"


def node(labels: dict[str, str], annotations: dict[str, str], cordoned: bool) -> dict:
    return {
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations},
        "spec": {"unschedulable": cordoned},
    }


def test_a_node_the_rollout_cordoned_and_gated_is_restored() -> None:
    n = node(
        {KEYS.state: "draining", GATE: "false"},
        {KEYS.cordon: "rollout", KEYS.gates: encode_gates({GATE: None})},
        True,
    )
    patch = abandon_patch(n, KEYS)
    assert patch is not None
    assert patch["spec"] == {"unschedulable": None}
    assert patch["metadata"]["labels"] == {KEYS.state: None, GATE: None}
    assert set(patch["metadata"]["annotations"]) == set(KEYS.annotations())
    assert all(v is None for v in patch["metadata"]["annotations"].values())


def test_an_admins_cordon_and_previous_gate_values_are_kept() -> None:
    n = node(
        {KEYS.state: "failed", GATE: "false"},
        {KEYS.cordon: "external", KEYS.gates: encode_gates({GATE: "true"})},
        True,
    )
    patch = abandon_patch(n, KEYS)
    assert patch is not None
    assert "spec" not in patch
    assert patch["metadata"]["labels"][GATE] == "true"


def test_a_node_the_rollout_never_touched_needs_no_write() -> None:
    assert abandon_patch(node({"other": "x"}, {}, False), KEYS) is None


def test_abandoning_releases_this_policys_claim_and_never_anothers() -> None:
    mine = {"metadata": {"labels": {}, "annotations": {HOLDER_ANNOTATION: KEYS.holder_id}}}
    body = abandon_patch(mine, KEYS)
    assert body is not None
    assert body["metadata"]["annotations"][HOLDER_ANNOTATION] is None
    theirs = {
        "metadata": {
            "labels": {KEYS.state: "required"},
            "annotations": {HOLDER_ANNOTATION: "other"},
        }
    }
    body = abandon_patch(theirs, KEYS)
    assert body is not None
    assert HOLDER_ANNOTATION not in body["metadata"]["annotations"]
