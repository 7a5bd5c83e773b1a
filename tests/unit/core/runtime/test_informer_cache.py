"""The informer's cache against a model apiserver: whatever the world did and however
the informer's watch was cut, resumed or expired, the cache equals a fresh list.

The model keeps every version of a small world of Nodes (create, relabel, update,
delete, delete and re-create under the same name with a new uid), each change at
the next resourceVersion, and serves what the apiserver's list/watch protocol
does: a list at the current resourceVersion; a watch from a resourceVersion that
sends every later change in order, filtered by a label selector the way the
apiserver filters (an object entering the selection is ADDED, one leaving it is
DELETED); bookmarks; and, once history is compacted, only a relist.
resourceVersions are integers in the model and opaque strings to the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.nodes import node_view, slim_node
from kmodkit.core.runtime.informer_cache import (
    ADDED,
    BOOKMARK,
    DELETED,
    MODIFIED,
    InformerCache,
    Key,
)

NAMES = ("a", "b", "c")
SELECTED = ("sel", "yes")


def _node(name: str, uid: str, rv: int, sel: bool, kernel: int, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {"sel": "yes" if sel else "no", "kubernetes.io/hostname": name},
            "annotations": {"kmodkit.io/x": str(kernel)},
            "managedFields": [{"manager": "kwok", "fieldsV1": {"f:status": {}}}],
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "nodeInfo": {"kernelVersion": f"6.{kernel}.0", "architecture": "amd64", "osImage": "x"},
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "r"},
                {"type": "MemoryPressure", "status": "False"},
            ],
            "images": [{"names": ["registry.example/big:1"], "sizeBytes": 1 << 30}],
            "capacity": {"cpu": "64"},
        },
    }


def _matches(obj: Mapping[str, Any] | None, selector: bool) -> bool:
    return obj is not None and (not selector or obj["metadata"]["labels"]["sel"] == "yes")


@dataclass
class World:
    """A model apiserver: every version of every object, by resourceVersion."""

    rv: int = 1
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, dict[str, Any] | None, dict[str, Any] | None]] = field(
        default_factory=list
    )
    """(rv, before, after) for every change; after is None for a delete."""
    uids: int = 0
    versions: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """The whole world as of each resourceVersion."""

    def change(self, op: str, name: str, sel: bool, kernel: int, ready: bool) -> None:
        before = self.objects.get(name)
        if op == "delete" and before is None:
            return
        if op == "recreate" and before is not None:
            self.change("delete", name, sel, kernel, ready)
            before = None
        self.rv += 1
        if op == "delete":
            assert before is not None
            gone = {**before, "metadata": {**before["metadata"], "resourceVersion": str(self.rv)}}
            del self.objects[name]
            self.history.append((self.rv, gone, None))
            self.versions[self.rv] = dict(self.objects)
            return
        if before is None:
            self.uids += 1
            uid = f"uid-{self.uids}"
        else:
            uid = before["metadata"]["uid"]
        after = _node(name, uid, self.rv, sel, kernel, ready)
        self.objects[name] = after
        self.history.append((self.rv, before, after))
        self.versions[self.rv] = dict(self.objects)

    def listing(self, selector: bool) -> tuple[list[dict[str, Any]], str]:
        items = [o for o in self.objects.values() if _matches(o, selector)]
        return items, str(self.rv)

    def watch(self, since: str, selector: bool) -> list[tuple[str, dict[str, Any]]]:
        """Every change after ``since``, as a watch with the selector sends it."""
        events = []
        for rv, before, after in self.history:
            if rv <= int(since):
                continue
            was, now = _matches(before, selector), _matches(after, selector)
            if after is None:
                if was:
                    assert before is not None
                    events.append((DELETED, before))
            elif was and now:
                events.append((MODIFIED, after))
            elif now:
                events.append((ADDED, after))
            elif was:
                events.append((DELETED, after))  # left the selection
        return events


world_ops = st.tuples(
    st.sampled_from(["put", "put", "delete", "recreate"]),
    st.sampled_from(NAMES),
    st.booleans(),
    st.integers(0, 2),
    st.booleans(),
)
informer_ops = st.one_of(
    st.tuples(st.just("deliver"), st.integers(1, 4)),
    st.just(("bookmark",)),
    st.just(("reconnect",)),  # the watch dropped; resumed from the cache's resourceVersion
    st.just(("gone",)),  # history compacted while disconnected: 410, then a relist
)
steps = st.lists(st.one_of(world_ops, informer_ops), max_size=40)


@dataclass
class Informer:
    """The protocol side of the real informer, driven by hand: one open watch."""

    world: World
    selector: bool
    cache: InformerCache[dict[str, Any]] = field(default_factory=lambda: InformerCache(slim_node))
    pending: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    delivered_upto: int = 0
    mirror: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """What a subscriber rebuilt from the changes alone."""

    def _record(self, changes: list[Any]) -> None:
        for c in changes:
            assert c.old != c.new, "a change reported where no view changed"
            assert self.mirror.get(c.key) == c.old, "a change whose old view is not the last one"
            if c.new is None:
                del self.mirror[c.key]
            else:
                self.mirror[c.key] = c.new

    def relist(self) -> None:
        items, rv = self.world.listing(self.selector)
        self._record(self.cache.replace(items, rv))
        self.pending = []
        self.delivered_upto = len(self.world.history)

    def reconnect(self) -> None:
        self.pending = []
        self.delivered_upto = len(self.world.history)
        self.pending = self.world.watch(self.cache.resource_version, self.selector)

    def step(self, op: tuple[Any, ...]) -> None:
        if op[0] in ("put", "delete", "recreate"):
            self.world.change(*op)
            return
        # Events the open watch has not queued yet join the queue in order.
        fresh = self.world.history[self.delivered_upto :]
        if fresh:
            self.pending += self.world.watch(str(fresh[0][0] - 1), self.selector)
            self.delivered_upto = len(self.world.history)
        if op[0] == "deliver":
            for _ in range(op[1]):
                if self.pending:
                    kind, obj = self.pending.pop(0)
                    change = self.cache.apply(kind, obj)
                    self._record([] if change is None else [change])
        elif op[0] == "bookmark" and not self.pending:
            # The apiserver bookmarks only a point it has sent everything up to.
            self.cache.apply(BOOKMARK, {"metadata": {"resourceVersion": str(self.world.rv)}})
        elif op[0] == "reconnect":
            self.reconnect()
        elif op[0] == "gone":
            self.relist()

    def drain(self) -> None:
        self.step(("deliver", 10_000))


def _fresh(world: World, selector: bool, rv: int | None = None) -> dict[Key, dict[str, Any]]:
    """The views a fresh list would give now (or as of ``rv``)."""
    objects = world.objects if rv is None else world.versions[rv]
    return {
        ("", o["metadata"]["name"]): slim_node(o) for o in objects.values() if _matches(o, selector)
    }


@settings(max_examples=400, deadline=None)
@given(before=steps, after=steps, selector=st.booleans())
def test_any_history_and_any_watch_schedule_ends_at_a_fresh_list(
    before: list[tuple[Any, ...]], after: list[tuple[Any, ...]], selector: bool
) -> None:
    world = World()
    informer = Informer(world, selector)
    for op in before:
        if op[0] in ("put", "delete", "recreate"):
            world.change(*op)
    informer.relist()
    assert informer.cache.views() == _fresh(world, selector)
    for op in after:
        informer.step(op)
        if op[0] == "gone":
            assert informer.cache.views() == _fresh(world, selector)
    informer.drain()
    assert informer.cache.views() == _fresh(world, selector)
    assert informer.mirror == informer.cache.views()


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(world_ops, min_size=1, max_size=20), selector=st.booleans())
def test_at_every_event_the_cache_is_the_world_as_of_its_resource_version(
    ops: list[tuple[Any, ...]], selector: bool
) -> None:
    world = World()
    informer = Informer(world, selector)
    informer.relist()
    for op in ops:
        world.change(*op)
    # A world change that the selector hides sends no event: the cache then stands for
    # every resourceVersion up to the next event.
    for kind, obj in world.watch(informer.cache.resource_version, selector):
        informer.cache.apply(kind, obj)
        assert informer.cache.views() == _fresh(
            world, selector, int(informer.cache.resource_version)
        )


@settings(max_examples=200, deadline=None)
@given(names=st.sets(st.sampled_from(NAMES), min_size=1), survivors=st.sets(st.sampled_from(NAMES)))
def test_deletes_during_a_disconnect_vanish_after_the_relist(
    names: set[str], survivors: set[str]
) -> None:
    world = World()
    for name in sorted(names):
        world.change("put", name, True, 0, True)
    informer = Informer(world, selector=False)
    informer.relist()
    for name in sorted(names - survivors):
        world.change("delete", name, True, 0, True)  # never delivered: the watch was down
    informer.step(("gone",))
    assert {k[1] for k in informer.cache.views()} == names & survivors
    assert {k[1] for k in informer.mirror} == names & survivors


def test_a_name_recreated_is_the_new_object_and_a_late_delete_of_the_old_one_is_ignored() -> None:
    cache: InformerCache[dict[str, Any]] = InformerCache(slim_node)
    old = _node("n", "uid-1", 2, True, 0, True)
    new = _node("n", "uid-2", 4, True, 1, True)
    cache.replace([old], "2")
    cache.apply(DELETED, {**old, "metadata": {**old["metadata"], "resourceVersion": "3"}})
    cache.apply(ADDED, new)
    assert cache.views()[("", "n")]["metadata"]["uid"] == "uid-2"
    assert cache.apply(DELETED, old) is None
    assert cache.views()[("", "n")]["metadata"]["uid"] == "uid-2"


@settings(max_examples=100, deadline=None)
@given(sel=st.booleans(), kernel=st.integers(0, 2), ready=st.booleans())
def test_views_are_slim_and_read_the_same_as_the_whole_node(
    sel: bool, kernel: int, ready: bool
) -> None:
    node = _node("n", "uid-1", 7, sel, kernel, ready)
    cache: InformerCache[dict[str, Any]] = InformerCache(slim_node)
    cache.replace([node], "7")
    view = cache.views()[("", "n")]
    assert set(view["metadata"]) == {"name", "uid", "resourceVersion", "labels", "annotations"}
    assert set(view["spec"]) <= {"unschedulable", "taints"}
    assert set(view["status"]) == {"nodeInfo", "conditions"}
    assert set(view["status"]["nodeInfo"]) <= {"kernelVersion", "architecture", "bootID"}
    assert [c["type"] for c in view["status"]["conditions"]] == ["Ready"]
    assert "images" not in repr(view) and "managedFields" not in repr(view)
    assert node_view(view) == node_view(node)
