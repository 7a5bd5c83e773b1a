"""Which driver changes reload tt-kmd and which only restart builders, and how many at once."""

from __future__ import annotations

from typing import Any

from kmodkit.backends.tenstorrent.builder_pods import BuilderPod
from kmodkit.backends.tenstorrent.driver_changes import (
    DriverTarget,
    builders_to_restart,
    is_outdated,
    needs_reload,
)
from kmodkit.core.nodes import NodeView

TARGET = DriverTarget("2.9.0", "new", force_unload=False, drain=True)
KMD = "driver.tenstorrent.com/kmd-version"
STATE = "rollout.kmodkit.io/ttdp.p"


def _pod(node: str, digest: str = "new", **fields: Any) -> BuilderPod:
    defaults: dict[str, Any] = {"force_unload": False, "ready": True, "deleting": False}
    return BuilderPod(
        name=f"b-{node}",
        namespace="ops",
        node=node,
        template_hash=digest,
        **{**defaults, **fields},
    )


def _node(name: str, ready: bool = True, **labels: str) -> NodeView:
    return NodeView(name=name, labels={KMD: "2.9.0", **labels}, ready=ready)


def test_only_another_loaded_version_needs_a_reload() -> None:
    assert needs_reload({KMD: "2.8.0"}, TARGET)
    assert not needs_reload({KMD: "2.9.0"}, TARGET)
    assert not needs_reload({}, TARGET), "nothing loaded: the builder loads directly"
    assert not needs_reload(
        {KMD: "2.8.0", "driver.tenstorrent.com/install-mode": "host"}, TARGET
    ), "DKMS nodes are never touched"


def test_outdated_is_an_older_template_or_a_refusal_under_the_old_force_setting() -> None:
    forced = DriverTarget("2.9.0", "new", force_unload=True, drain=True)
    assert is_outdated(_pod("a", "old"), TARGET)
    assert not is_outdated(_pod("a"), TARGET)
    assert not is_outdated(_pod("a"), forced), "forceUnload alone replaces no healthy builder"
    assert is_outdated(_pod("a", ready=False, crash_loop=True), forced)
    assert not is_outdated(_pod("a", ready=False, crash_loop=True, force_unload=True), forced)


def test_restarts_one_healthy_builder_at_a_time() -> None:
    nodes = [_node(n) for n in "abc"]
    pods = {n: _pod(n, "old") for n in "abc"}
    assert builders_to_restart(nodes, pods, TARGET, STATE, 1) == [pods["a"]]
    # a's replacement is starting: it holds the slot until it is Ready.
    starting = {**pods, "a": _pod("a", ready=False)}
    assert builders_to_restart(nodes, starting, TARGET, STATE, 1) == []
    going = {**pods, "a": _pod("a", "old", deleting=True)}
    assert builders_to_restart(nodes, going, TARGET, STATE, 1) == []
    missing = {n: p for n, p in pods.items() if n != "a"}
    assert builders_to_restart(nodes, missing, TARGET, STATE, 1) == []
    done = {**pods, "a": _pod("a")}
    assert builders_to_restart(nodes, done, TARGET, STATE, 1) == [pods["b"]]
    assert builders_to_restart(nodes, pods, TARGET, STATE, 2) == [pods["a"], pods["b"]]


def test_broken_outdated_builders_are_replaced_at_once() -> None:
    nodes = [_node(n) for n in "abc"]
    pods = {
        "a": _pod("a", "old"),
        "b": _pod("b", "old", ready=False),
        "c": _pod("c", ready=False, crash_loop=True),
    }
    forced = DriverTarget("2.9.0", "new", force_unload=True, drain=True)
    assert builders_to_restart(nodes, pods, forced, STATE, 1) == [pods["b"], pods["c"]]


def test_nodes_needing_a_reload_or_held_by_the_rollout_are_not_restarted() -> None:
    nodes = [
        _node("reload", **{KMD: "2.8.0"}),
        _node("swapping", **{STATE: "swapping"}),
        _node("failed", **{STATE: "failed"}),
        _node("down", ready=False),
        _node("skipped", **{"driver.tenstorrent.com/skip": "true"}),
        _node("done", **{STATE: "done"}),
        _node("fresh", **{KMD: ""}),
        _node("host", **{KMD: "", "driver.tenstorrent.com/install-mode": "host"}),
    ]
    pods = {n.name: _pod(n.name, "old") for n in nodes}
    assert builders_to_restart(nodes, pods, TARGET, STATE, 10) == [
        pods["done"],
        pods["fresh"],
        pods["host"],
    ]
    # Builders waiting for the rollout, or on nodes it holds, do not stall the restarts.
    waiting = {**pods, "reload": _pod("reload", ready=False), "swapping": _pod("x", ready=False)}
    assert builders_to_restart(nodes, waiting, TARGET, STATE, 1) == [pods["done"]]
