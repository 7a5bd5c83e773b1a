"""A Module's objects grouped from an informer's changes equal the grouping of a fresh list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.runtime.informer_cache import InformerCache
from kmodkit.core.runtime.owned_index import OwnedIndex

Group = tuple[str, str]


def _pod(name: str, module: str, phase: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": {"kmodkit.io/module": module},
        },
        "status": {"phase": phase},
    }


def _view(obj: Mapping[str, Any]) -> tuple[Group, str]:
    meta = obj["metadata"]
    return (meta["namespace"], meta["labels"]["kmodkit.io/module"]), obj["status"]["phase"]


pods = st.dictionaries(
    st.sampled_from(["p1", "p2", "p3", "p4"]),
    st.tuples(st.sampled_from(["m1", "m2"]), st.sampled_from(["Pending", "Running"])),
)


@settings(max_examples=200, deadline=None)
@given(worlds=st.lists(pods, min_size=1, max_size=6), relist=st.lists(st.booleans(), min_size=6))
def test_grouped_changes_equal_a_fresh_grouping(
    worlds: list[dict[str, tuple[str, str]]], relist: list[bool]
) -> None:
    cache: InformerCache[tuple[Group, str]] = InformerCache(_view)
    index: OwnedIndex[Group, str] = OwnedIndex()
    before: dict[str, tuple[str, str]] = {}
    for rv, (world, whole) in enumerate(zip(worlds, relist, strict=False), start=1):
        objs = {n: _pod(n, m, phase, rv) for n, (m, phase) in world.items()}
        if whole or rv == 1:
            touched = index.apply(cache.replace(objs.values(), str(rv)))
        else:  # the same step as watch events: deletes, then adds and updates
            touched = set()
            for name in before.keys() - world.keys():
                gone = _pod(name, *before[name], rv)
                if (change := cache.apply("DELETED", gone)) is not None:
                    touched |= index.apply([change])
            for obj in objs.values():
                if (change := cache.apply("MODIFIED", obj)) is not None:
                    touched |= index.apply([change])
        moved = set()
        for name in world.keys() | before.keys():
            if before.get(name) != world.get(name):
                moved |= {pod[0] for pod in (before.get(name), world.get(name)) if pod}
        assert {g[1] for g in touched} == moved, "woke other loops than the changed Modules'"
        for module in ("m1", "m2"):
            want = sorted(phase for m, phase in world.values() if m == module)
            assert sorted(index.get(("ns", module))) == want
        before = world
