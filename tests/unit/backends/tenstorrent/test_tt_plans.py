"""The Tenstorrent plans, pure: a policy and an observed cluster to objects, rollout, status."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from kmodkit.backends import tenstorrent
from kmodkit.backends.tenstorrent import driver_plan, firmware_plan
from kmodkit.backends.tenstorrent.builder_pods import builder_pod
from kmodkit.backends.tenstorrent.driver_changes import DriverTarget, needs_rollout
from kmodkit.backends.tenstorrent.driver_hooks import verdict
from kmodkit.backends.tenstorrent.firmware_hooks import FirmwareTarget, needs_flash
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.contract.hooks import Pending, Validated
from kmodkit.core.nodes import NodeView
from tests.unit.backends.cached import as_cached

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PCI = {"feature.node.kubernetes.io/pci-1200_1e52.present": "true"}


def _node(name: str, **labels: str) -> NodeView:
    return NodeView(name=name, labels={**PCI, "pool": "tt", **labels}, ready=True)


def _ttdp(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": "default", "generation": 3, "uid": "u"},
        "spec": {"version": "2.9.0", "nodeAffinity": {"matchLabels": {"pool": "tt"}}, **spec},
    }


def _view(
    nodes: list[NodeView], pods: list[dict[str, Any]] = (), owned: bool = True
) -> ClusterView:  # type: ignore[assignment]
    return ClusterView(
        nodes=nodes,
        api_groups=frozenset(),
        operator_namespace="ops",
        watched=as_cached(tenstorrent.backend, {driver_plan.BUILDERS: pods}),
        owned=[
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ttdrv-default"}}
        ]
        if owned
        else [],
    )


def _pod(
    node: str, digest: str, version: str = "2.9.0", ready: bool = True, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ttdrv-default-{node}",
            "namespace": "ops",
            "labels": {"driver.tenstorrent.com/cr": "default"},
            "annotations": {"driver.tenstorrent.com/template-hash": digest},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "builder", "env": [{"name": "TT_KMD_VERSION", "value": version}]}
            ],
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **status,
        },
    }


def _digest() -> str:
    plan = driver_plan.plan_at(_ttdp(), _view([]), NOW)
    return str(plan.objects[0]["metadata"]["annotations"]["driver.tenstorrent.com/template-hash"])


def _states(plan: Any) -> dict[str, tuple[str, str]]:
    return {n["name"]: (n["state"], n["reason"]) for n in plan.status["nodes"]}


def test_driver_status_per_node() -> None:
    digest = _digest()
    crash = {
        "containerStatuses": [
            {
                "name": "builder",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {
                        "message": json.dumps(
                            {"message": "in use", "holders": [{"pid": 7, "comm": "tt-smi"}]}
                        )
                    }
                },
            }
        ]
    }
    nodes = [
        _node(
            "done",
            **{
                "driver.tenstorrent.com/kmd-version": "2.9.0",
                "driver.tenstorrent.com/install-mode": "container",
            },
        ),
        _node("host", **{"driver.tenstorrent.com/install-mode": "host"}),
        _node("crash", **{"driver.tenstorrent.com/kmd-version": "2.8.0"}),
        _node("old", **{"driver.tenstorrent.com/kmd-version": "2.8.0"}),
        _node("draining", **{"rollout.kmodkit.io/ttdp.default": "evicting"}),
        _node("skipped", **{"driver.tenstorrent.com/skip": "true"}),
        NodeView(name="no-device", labels={"pool": "tt"}),
    ]
    pods = [
        _pod("done", digest),
        _pod("crash", digest, ready=False, **crash),
        _pod("old", "0ld", version="2.8.0"),
        _pod("draining", "0ld", version="2.8.0"),
    ]
    plan = driver_plan.plan_at(_ttdp(), _view(nodes, pods), NOW)
    states = _states(plan)
    assert "no-device" not in states
    assert states == {
        "done": ("Done", "Ready"),
        "host": ("HostManaged", "HostManagedKMD"),
        "crash": ("Failed", "BuilderCrashLoop"),
        "old": ("Pending", "UpgradeRequired"),
        "draining": ("Draining", "Draining"),
        "skipped": ("Skipped", "Skipped"),
    }
    crash_entry = next(n for n in plan.status["nodes"] if n["name"] == "crash")
    assert crash_entry["message"] == "in use [holders: pid 7 (tt-smi)]"
    assert crash_entry["currentVersion"] == "2.8.0"
    assert next(n["name"] for n in plan.status["nodes"]) == "crash", "failed nodes first"
    summary = plan.status["summary"]
    assert summary == {
        "matched": 6,
        "ready": 1,
        "upToDate": 2,
        "inProgress": 1,
        "failed": 1,
        "pending": 1,
        "hostManaged": 1,
        "skipped": 1,
        "conflicts": 0,
    }
    assert plan.rollout is not None
    assert plan.rollout.policy.max_parallel == 1
    assert plan.rollout.policy.deploy_gates == {"tenstorrent.com/deploy.tt-telemetry": "false"}
    assert sorted(plan.rollout.nodes) == sorted(states)


def test_status_is_unchanged_when_nothing_changed() -> None:
    nodes = [_node("a", **{"driver.tenstorrent.com/kmd-version": "2.9.0"})]
    first = driver_plan.plan_at(_ttdp(), _view(nodes, [_pod("a", _digest())]), NOW)
    body = {**_ttdp(), "status": first.status}
    later = driver_plan.plan_at(
        body, _view(nodes, [_pod("a", _digest())]), NOW + timedelta(hours=1)
    )
    assert later.status == first.status


def test_paused_policy_starts_no_builder_until_unpaused() -> None:
    paused = driver_plan.plan_at(_ttdp(paused=True), _view([_node("a")], owned=False), NOW)
    assert paused.objects == []
    assert _states(paused) == {"a": ("Pending", "Paused")}
    conditions = {c["type"]: c["reason"] for c in paused.status["conditions"]}
    assert conditions["Progressing"] == "Paused"
    kept = driver_plan.plan_at(_ttdp(paused=True), _view([_node("a")]), NOW).objects
    assert [o["kind"] for o in kept] == ["DaemonSet", "ConfigMap"]


def test_the_pause_reaches_running_builders_through_their_control_map() -> None:
    def control(paused: bool) -> tuple[dict[str, str], str]:
        objects = driver_plan.plan_at(_ttdp(paused=paused), _view([_node("a")]), NOW).objects
        ds, cm = objects
        return cm["data"], str(
            ds["metadata"]["annotations"]["driver.tenstorrent.com/template-hash"]
        )

    (paused, paused_hash), (running, running_hash) = control(True), control(False)
    assert paused == {"paused": "true"} and running == {"paused": "false"}
    assert paused_hash == running_hash, "pausing must not make the running builders stale"
    ds = driver_plan.plan_at(_ttdp(), _view([_node("a")]), NOW).objects[0]
    pod = ds["spec"]["template"]["spec"]
    assert {"name": "policy", "configMap": {"name": ds["metadata"]["name"]}} in pod["volumes"]
    mount = {"name": "policy", "mountPath": "/run/tt-builder/policy", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"]


def test_drain_off_means_no_gates_and_no_eviction() -> None:
    plan = driver_plan.plan_at(_ttdp(upgradePolicy={"drain": {"enable": False}}), _view([]), NOW)
    assert plan.rollout is not None
    assert plan.rollout.policy.deploy_gates == {}
    assert plan.rollout.policy.drain.enable is False


def test_invalid_spec_keeps_the_daemonset_and_says_why() -> None:
    plan = driver_plan.plan_at(
        _ttdp(upgradePolicy={"drain": {"podSelectorLabel": "a in b"}}), _view([]), NOW
    )
    assert plan.rollout is None
    assert [o["metadata"]["name"] for o in plan.objects] == ["ttdrv-default"]
    ready = next(c for c in plan.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert "spec.upgradePolicy.drain.podSelectorLabel" in ready["message"]


def test_driver_verdict() -> None:
    target = DriverTarget("2.9.0", "new", force_unload=False, drain=True)
    fresh = builder_pod(_pod("a", "new"))
    stale = builder_pod(_pod("a", "old", version="2.8.0"))
    assert isinstance(
        verdict({"driver.tenstorrent.com/kmd-version": "2.9.0"}, fresh, target), Validated
    )
    assert isinstance(
        verdict({"driver.tenstorrent.com/kmd-version": "2.8.0"}, fresh, target), Pending
    )
    assert isinstance(verdict({}, stale, target), Pending)
    forced = DriverTarget("2.9.0", "new", force_unload=True, drain=True)
    assert isinstance(
        verdict({"driver.tenstorrent.com/kmd-version": "2.9.0"}, fresh, forced), Validated
    ), "a healthy builder is not replaced for forceUnload alone"


def test_force_unload_is_no_target_identity() -> None:
    """Toggling forceUnload leaves healthy nodes Done and their builders current."""
    nodes = [_node("a", **{"driver.tenstorrent.com/kmd-version": "2.9.0"})]
    pods = [_pod("a", _digest())]
    for force in (True, False):
        plan = driver_plan.plan_at(
            _ttdp(upgradePolicy={"forceUnload": force}), _view(nodes, pods), NOW
        )
        assert _states(plan) == {"a": ("Done", "Ready")}
        assert plan.status["summary"]["upToDate"] == 1
        assert (
            plan.objects[0]["metadata"]["annotations"]["driver.tenstorrent.com/template-hash"]
            == _digest()
        )


def test_a_builder_restart_is_reported_pending_without_a_reload() -> None:
    nodes = [_node("a", **{"driver.tenstorrent.com/kmd-version": "2.9.0"})]
    plan = driver_plan.plan_at(_ttdp(), _view(nodes, [_pod("a", "0ld")]), NOW)
    assert _states(plan) == {"a": ("Pending", "BuilderRestartPending")}


def _ttfwp(
    status: dict[str, Any] | None = None, generation: int = 1, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": {"name": "fw", "generation": generation},
        "spec": {"version": "19.9.0", "nodeAffinity": {}, **spec},
    }
    if status is not None:
        body["status"] = status
    return body


def test_force_write_request_is_the_generation_it_was_switched_on_at() -> None:
    view = _view([_node("a")])
    off = firmware_plan.plan_at(_ttfwp(generation=4), view, NOW)
    assert off.status["forceWriteRequest"] == 0
    on = firmware_plan.plan_at(_ttfwp(off.status, 5, flasher={"forceWrite": True}), view, NOW)
    assert on.status["forceWriteRequest"] == 5
    assert on.rollout is not None and on.rollout.target == "19.9.0/force-5"
    edited = firmware_plan.plan_at(_ttfwp(on.status, 6, flasher={"forceWrite": True}), view, NOW)
    assert edited.status["forceWriteRequest"] == 5


def test_a_node_is_flashed_once_per_version_and_once_per_force_request() -> None:
    target = FirmwareTarget("fw", "19.9.0.0", auto_upgrade=True, force_request=None)
    assert needs_flash({}, target)
    done = {"firmware.tenstorrent.com/current-version": "19.9.0.0"}
    assert not needs_flash(done, target)
    forced = FirmwareTarget("fw", "19.9.0.0", auto_upgrade=True, force_request=5)
    assert needs_flash(done, forced)
    assert not needs_flash({**done, "firmware.tenstorrent.com/force-written": "fw/5"}, forced)
    assert not needs_flash({}, FirmwareTarget("fw", "19.9.0.0", False, None))


def test_firmware_status_per_node() -> None:
    nodes = [
        _node("done", **{"firmware.tenstorrent.com/fw-version": "19.9.0.0"}),
        _node("old", **{"firmware.tenstorrent.com/fw-version": "19.8.0.0"}),
        _node("flashing", **{"rollout.kmodkit.io/ttfwp.fw": "validating"}),
        _node("failed", **{"rollout.kmodkit.io/ttfwp.fw": "failed"}),
    ]
    plan = firmware_plan.plan_at(_ttfwp(), _view(nodes), NOW)
    assert _states(plan) == {
        "done": ("Done", "FlashSucceeded"),
        "old": ("Pending", "UpgradeRequired"),
        "flashing": ("Flashing", "Flashing"),
        "failed": ("Failed", "RolloutFailed"),
    }
    flashing = next(n for n in plan.status["nodes"] if n["name"] == "flashing")
    assert flashing["lastFlashJob"].startswith("ttfwp-fw-flashing-19-9-0-")
    conditions = {c["type"]: c["reason"] for c in plan.status["conditions"]}
    assert conditions == {"Ready": "NodesFailed", "Progressing": "NodesUpgrading"}
    drift = firmware_plan.plan_at(
        _ttfwp(upgradePolicy={"autoUpgrade": False}), _view(nodes[:2]), NOW
    )
    assert _states(drift)["old"] == ("Pending", "AutoUpgradeDisabled")


def test_declared_controls_are_what_the_plans_request() -> None:
    """``kubectl kmodkit`` acts on the declared controls; the plans must request the same."""
    from kmodkit.backends.tenstorrent import backend

    driver, firmware = backend.resources
    view = _view([_node("a")])
    for resource, body in (
        (driver, _ttdp(paused=True)),
        (firmware, {**_ttfwp(), "spec": {**_ttfwp()["spec"], "paused": True}}),
    ):
        controls = resource.controls
        assert controls is not None and controls.pause_field is not None
        request = resource.plan(body, view).rollout
        assert request is not None
        assert request.policy_id == controls.policy_id(body["metadata"]["name"])
        assert request.skip_label == controls.skip_label
        assert request.paused is body["spec"][controls.pause_field] is True


def _first_starts(plan: Any) -> list[str]:
    """The nodes the rollout the plan requests would start first, on a fleet where one node is
    down, one is cordoned by an admin, one failed (for this target) and two are healthy."""
    from kmodkit.core.rollout.keys import RolloutKeys
    from kmodkit.core.rollout.observed import NodeRecord
    from kmodkit.core.rollout.observed import NodeView as RolloutNode
    from kmodkit.core.rollout.plan import Context
    from kmodkit.core.rollout.plan import plan as rollout_plan
    from kmodkit.core.rollout.states import State

    request = plan.rollout
    assert request is not None
    failed = NodeRecord(target=request.target, cordon="rollout")
    views = [
        RolloutNode("a-down", State.REQUIRED, ready=False, needs_update=True),
        RolloutNode("b-admin", State.REQUIRED, unschedulable=True, needs_update=True),
        RolloutNode("c-failed", State.FAILED, unschedulable=True, record=failed),
        RolloutNode("d-healthy", State.REQUIRED, needs_update=True),
        RolloutNode("e-healthy", State.REQUIRED, needs_update=True),
    ]
    keys = RolloutKeys.for_policy(request.policy_id)
    steps = rollout_plan(views, Context(request.policy, keys, request.target, 0.0)).steps
    return [s.node for s in steps if s.after is State.CORDONING]


def test_nodes_down_cordoned_or_failed_hold_neither_policy_back() -> None:
    # The policies bound what the rollout takes out of service, one node (maxParallel)
    # at a time; other nodes out of service use none of it.
    driver = driver_plan.plan_at(_ttdp(upgradePolicy={"haltOnFailure": False}), _view([]), NOW)
    assert _first_starts(driver) == ["d-healthy"]
    firmware = firmware_plan.plan_at(
        _ttfwp(upgradePolicy={"haltOnFailure": False, "maxParallel": 2}), _view([]), NOW
    )
    assert _first_starts(firmware) == ["d-healthy", "e-healthy"]


def test_both_policies_leave_cordoned_nodes_alone_unless_told_to_upgrade_them() -> None:
    for make, plan_at in ((_ttdp, driver_plan.plan_at), (_ttfwp, firmware_plan.plan_at)):
        default = plan_at(make(), _view([]), NOW).rollout
        assert default is not None and default.policy.upgrade_cordoned_nodes is False
        opted = plan_at(make(upgradePolicy={"upgradeCordonedNodes": True}), _view([]), NOW)
        assert opted.rollout is not None and opted.rollout.policy.upgrade_cordoned_nodes is True


def test_a_vacated_standby_node_is_taken_over_through_the_rollout() -> None:
    target = DriverTarget("2.9.0", _digest(), False, True)
    standby = builder_pod(_pod("a", _digest(), ready=False))
    successor = builder_pod(
        {
            **_pod("a", _digest()),
            "metadata": {**_pod("a", _digest())["metadata"], "name": "ttdrv-default-new"},
        }
    )
    labels = {"driver.tenstorrent.com/standby-pod": standby.name}

    assert needs_rollout(labels, standby, target), "the takeover is rolled (cordon, drain)"
    assert isinstance(verdict(labels, standby, target), Pending)
    # The successor is not the pod named on the node: it is what the swap waits for.
    assert not needs_rollout(labels, successor, target)

    plan = driver_plan.plan_at(
        _ttdp(), _view([_node("a", **labels)], [_pod("a", _digest(), ready=False)]), NOW
    )
    assert _states(plan) == {"a": ("Pending", "TakeoverRequired")}
