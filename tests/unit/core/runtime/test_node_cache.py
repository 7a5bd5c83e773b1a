"""The node cache the passes read, fed by the node informer's changes.

The Kube here is a stand-in with no methods: feeding the cache makes no API call.
"""

from __future__ import annotations

from typing import Any

from kmodkit.core.nodes import node_view, slim_node
from kmodkit.core.runtime.informer_cache import Change, InformerCache
from kmodkit.core.runtime.watch_cache import Shared


class NoKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube that nothing may call."""


def _node(name: str, rv: str, kernel: str = "6.8.0-45-generic") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv},
        "status": {"nodeInfo": {"kernelVersion": kernel}},
    }


def _shared() -> Shared:
    return Shared(kube=NoKube(), operator_namespace="kmodkit-system", nodes_synced=True)  # type: ignore[arg-type]


def test_a_heartbeat_updates_the_object_but_wakes_no_loop() -> None:
    shared = _shared()
    cache: InformerCache[dict[str, Any]] = InformerCache(slim_node)
    shared.nodes_changed(cache.replace([_node("a", "1")], "1"))
    woken = shared.wakeups.event("loop")
    change = cache.apply("MODIFIED", _node("a", "2"))  # only the resourceVersion moved
    assert change is not None
    shared.nodes_changed([change])
    assert shared.node_objects["a"]["metadata"]["resourceVersion"] == "2"
    assert not woken.is_set()
    change = cache.apply("MODIFIED", _node("a", "3", kernel="7.0.0-14-generic"))
    assert change is not None
    shared.nodes_changed([change])
    assert shared.nodes["a"] == node_view(_node("a", "3", kernel="7.0.0-14-generic"))
    assert woken.is_set()


def test_a_relist_replaces_the_dicts_a_pass_may_be_reading() -> None:
    shared = _shared()
    cache: InformerCache[dict[str, Any]] = InformerCache(slim_node)
    shared.nodes_changed(cache.replace([_node("a", "1"), _node("b", "1")], "1"))
    reading_nodes, reading_objects = shared.nodes, shared.node_objects
    # b was deleted while the watch was down; c was added.
    shared.nodes_changed(cache.replace([_node("a", "1"), _node("c", "5")], "5"))
    assert set(shared.nodes) == set(shared.node_objects) == {"a", "c"}
    assert set(reading_nodes) == set(reading_objects) == {"a", "b"}, "a pass saw a half relist"


def test_changes_before_the_first_list_landed_wake_nothing() -> None:
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    woken = shared.wakeups.event("loop")
    shared.nodes_changed([Change(("", "a"), None, slim_node(_node("a", "1")))])
    assert "a" in shared.nodes and not woken.is_set()


def test_a_loop_that_said_which_nodes_concern_it_is_woken_by_those_only() -> None:
    shared = _shared()
    cache: InformerCache[dict[str, Any]] = InformerCache(slim_node)
    shared.nodes_changed(cache.replace([_node("a", "1"), _node("b", "1")], "1"))
    seen: list[list[str]] = []

    def only_b(moved: Any) -> bool:
        seen.append([(old or new).name for old, new in moved])
        return any((old or new).name == "b" for old, new in moved)

    picky, every = shared.wakeups.event("picky"), shared.wakeups.event("every")
    shared.wakeups.interest("picky", only_b)
    for name in ("a", "b"):
        change = cache.apply("MODIFIED", _node(name, "2", kernel="7.0.0-14-generic"))
        assert change is not None
        shared.nodes_changed([change])
        assert every.is_set(), "a loop that never said is woken by every node"
        assert picky.is_set() == (name == "b")
    assert seen == [["a"], ["b"]]
