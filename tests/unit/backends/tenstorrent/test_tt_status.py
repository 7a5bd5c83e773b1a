"""What the Tenstorrent policies' status says: pause, flasher image pulls."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kmodkit.backends import tenstorrent
from kmodkit.backends.tenstorrent import driver_plan, firmware_plan
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.nodes import NodeView
from tests.unit.backends.cached import as_cached

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PCI = {"feature.node.kubernetes.io/pci-1200_1e52.present": "true"}
DRIVER_ROLLOUT = "rollout.kmodkit.io/ttdp.default"
FIRMWARE_ROLLOUT = "rollout.kmodkit.io/ttfwp.fw"


def _node(name: str, **labels: str) -> NodeView:
    return NodeView(name=name, labels={**PCI, **labels}, ready=True)


def _view(nodes: list[NodeView], **watched: list[dict[str, Any]]) -> ClusterView:
    return ClusterView(
        nodes=nodes,
        api_groups=frozenset(),
        operator_namespace="ops",
        watched=as_cached(tenstorrent.backend, watched),
        owned=[{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ttdrv-d"}}],
    )


def _conditions(plan: Any) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in plan.status["conditions"]}


def _ttdp(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "default", "generation": 2},
        "spec": {"version": "2.9.0", "nodeAffinity": {}, **spec},
    }


def _ttfwp(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "fw", "generation": 2},
        "spec": {"version": "19.9.0", "nodeAffinity": {}, **spec},
    }


def test_a_paused_policy_says_so_in_both_conditions_while_a_node_finishes() -> None:
    nodes = [_node("busy", **{DRIVER_ROLLOUT: "evicting"}), _node("next")]
    plan = driver_plan.plan_at(_ttdp(paused=True), _view(nodes), NOW)
    assert _conditions(plan) == {"Ready": ("False", "Paused"), "Progressing": ("True", "Paused")}
    message = next(c for c in plan.status["conditions"] if c["type"] == "Progressing")["message"]
    assert "1 node(s) in flight finish" in message
    idle = driver_plan.plan_at(_ttdp(paused=True), _view([_node("next")]), NOW)
    assert _conditions(idle) == {"Ready": ("False", "Paused"), "Progressing": ("False", "Paused")}

    fw_nodes = [_node("busy", **{FIRMWARE_ROLLOUT: "validating"}), _node("next")]
    fw = firmware_plan.plan_at(_ttfwp(paused=True), _view(fw_nodes), NOW)
    assert _conditions(fw) == {"Ready": ("False", "Paused"), "Progressing": ("True", "Paused")}
    fw_idle = firmware_plan.plan_at(_ttfwp(paused=True), _view([_node("next")]), NOW)
    assert _conditions(fw_idle) == {
        "Ready": ("False", "Paused"),
        "Progressing": ("False", "Paused"),
    }


def test_pause_hides_neither_a_failure_nor_a_finished_rollout() -> None:
    failed = [_node("bad", **{DRIVER_ROLLOUT: "failed"})]
    plan = driver_plan.plan_at(_ttdp(paused=True), _view(failed), NOW)
    assert _conditions(plan)["Ready"] == ("False", "NodesFailed")
    done = [_node("ok", **{"firmware.tenstorrent.com/fw-version": "19.9.0.0"})]
    fw = firmware_plan.plan_at(_ttfwp(paused=True), _view(done), NOW)
    assert _conditions(fw) == {"Ready": ("True", "AllUpToDate"), "Progressing": ("False", "Paused")}


def _flash_pod(node: str, waiting: str, policy: str = "fw") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ttfwp-{policy}-{node}-abcde",
            "namespace": "ops",
            "labels": {
                "firmware.tenstorrent.com/cr": policy,
                "firmware.tenstorrent.com/node": node,
            },
        },
        "spec": {"nodeName": node},
        "status": {
            "containerStatuses": [
                {"name": "flash", "state": {"waiting": {"reason": waiting, "message": "x"}}}
            ]
        },
    }


def test_a_flasher_image_that_cannot_be_pulled_has_its_own_reason() -> None:
    nodes = [
        _node("pulling", **{FIRMWARE_ROLLOUT: "validating"}),
        _node("starting", **{FIRMWARE_ROLLOUT: "validating"}),
        _node("other-policy", **{FIRMWARE_ROLLOUT: "validating"}),
    ]
    pods = [
        _flash_pod("pulling", "ImagePullBackOff"),
        _flash_pod("starting", "ContainerCreating"),
        _flash_pod("other-policy", "ErrImagePull", policy="fw2"),
    ]
    plan = firmware_plan.plan_at(_ttfwp(), _view(nodes, **{firmware_plan.FLASHERS: pods}), NOW)
    rows = {n["name"]: n for n in plan.status["nodes"]}
    assert (rows["pulling"]["state"], rows["pulling"]["reason"]) == (
        "Flashing",
        "FlasherImagePullFailed",
    )
    assert "ImagePullBackOff" in rows["pulling"]["message"]
    assert "imagePullSecrets" in rows["pulling"]["message"]
    assert rows["starting"]["reason"] == "Flashing"
    assert rows["other-policy"]["reason"] == "Flashing"


def _builder_pod(node: str, waiting: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ttdrv-default-{node}",
            "namespace": "ops",
            "labels": {"driver.tenstorrent.com/cr": "default"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "builder"}]},
        "status": {
            "containerStatuses": [{"name": "builder", "state": {"waiting": {"reason": waiting}}}]
        },
    }


def test_each_observed_node_transition_is_one_event() -> None:
    nodes = [
        _node("pull"),
        _node("unlisted"),
        _node("host", **{"driver.tenstorrent.com/install-mode": "host"}),
    ]
    pods = [_builder_pod("pull", "ErrImagePull"), _builder_pod("unlisted", "ErrImagePull")]
    view = _view(nodes, **{driver_plan.BUILDERS: pods})
    waiting = {"state": "Pending", "reason": "WaitingForBuilder"}
    before = {"nodes": [{"name": "pull", **waiting}, {"name": "host", **waiting}]}
    first = driver_plan.plan_at({**_ttdp(), "status": before}, view, NOW)
    events = {e.node: e for e in first.events}
    assert set(events) == {"pull", "host"}  # "unlisted" was not in the status: not compared
    assert (events["pull"].reason, events["pull"].warning) == ("BuilderImagePullFailed", True)
    assert "ErrImagePull" in events["pull"].message
    assert (events["host"].reason, events["host"].warning) == ("HostManagedKMD", False)
    again = driver_plan.plan_at({**_ttdp(), "status": dict(first.status)}, view, NOW)
    assert list(again.events) == []

    fw_nodes = [_node("flash", **{FIRMWARE_ROLLOUT: "validating"})]
    fw_view = _view(fw_nodes, **{firmware_plan.FLASHERS: [_flash_pod("flash", "ErrImagePull")]})
    fw_before = {"nodes": [{"name": "flash", "state": "Flashing", "reason": "Flashing"}]}
    fw = firmware_plan.plan_at({**_ttfwp(), "status": fw_before}, fw_view, NOW)
    assert [(e.node, e.reason, e.warning) for e in fw.events] == [
        ("flash", "FlasherImagePullFailed", True)
    ]
    # The rollout's own moves (here into Flashing) are posted by the rollout, not again here.
    moved = firmware_plan.plan_at(
        {**_ttfwp(), "status": {"nodes": [{"name": "flash", "state": "Pending", "reason": ""}]}},
        _view(fw_nodes),
        NOW,
    )
    assert list(moved.events) == []
