"""A pass creates loader pods for one slice of time, and labels the ready nodes first.

So a new Module over a large fleet labels its first nodes while the rest of their pods
are still being created, instead of after all of them. The Kube is the recording
stand-in of test_module_builds (no API server); the clock is a variable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kmodkit.core.engine.loader_plan import LoaderPlan
from kmodkit.core.engine.loader_pod import loader_pod_view
from kmodkit.core.engine.registry import Existence
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime import module_controller
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.unseen_writes import UnseenWrites
from kmodkit.core.runtime.writes import Write, WritePool
from tests.unit.core.runtime.test_module_builds import KERNEL, NAME, NS, RecordingKube, _controller

READY = f"kmm.node.kubernetes.io/{NS}.{NAME}.ready"


def _module() -> dict[str, Any]:
    mapping = {"regexp": ".*", "containerImage": f"r.io/xe:{KERNEL}"}
    return {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": NAME, "namespace": NS, "uid": "u1", "generation": 1},
        "spec": {
            "selector": {},
            "moduleLoader": {
                "container": {"modprobe": {"moduleName": "xe"}, "kernelMappings": [mapping]}
            },
        },
    }


class Clock:
    """Each reading is a second later: every round of writes outlasts a short slice."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_run_for_stops_starting_rounds_once_its_time_is_up() -> None:
    pool = WritePool(2, api_message)
    done: list[int] = []
    writes = [Write(f"w{i}", lambda i=i: done.append(i)) for i in range(10)]
    # Rounds of twice the width (4); the clock, read before each round after the first,
    # passes the deadline (1.5 s after the start) after two rounds.
    results = pool.run_for(writes, 1.5, clock=Clock())
    assert results == [None] * 8 and sorted(done) == list(range(8))
    # One round at least, however short the time.
    assert len(pool.run_for(writes, 0, clock=Clock())) == 4
    assert len(pool.run_for(writes, 60)) == 10


def test_creations_left_for_the_next_pass_keep_their_nodes_old_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(module_controller, "CREATE_SLICE_SECONDS", 0.0)
    kube = RecordingKube()
    deleted: list[str] = []
    kube.delete_pod = lambda _ns, name: deleted.append(name)  # type: ignore[attr-defined]
    controller = _controller(kube, Existence.EXISTS)
    nodes = [f"n{i}" for i in range(5)]
    final = LoaderPlan(
        create=[{"metadata": {"name": f"new-{n}"}, "spec": {"nodeName": n}} for n in nodes],
        deletes_by_node={n: [f"old-{n}"] for n in nodes},
    )
    unseen = UnseenWrites()
    failures, cut_short = controller._apply_pods(final, {"kind": "Module"}, NS, unseen)
    # One round of a one-wide pool: two creations; only their nodes' old pods go.
    assert failures == [] and cut_short
    assert [c[1] for c in kube.calls if c[0] == "create"] == ["new-n0", "new-n1"]
    assert deleted == ["old-n0", "old-n1"]
    assert not unseen.unseen(("pod", "new-n2"))


def test_a_pass_labels_ready_nodes_before_it_creates_and_comes_back_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(module_controller, "CREATE_SLICE_SECONDS", 0.0)
    kube = RecordingKube()
    controller = _controller(kube, Existence.EXISTS)
    for i in range(2, 6):
        controller.shared.nodes[f"n{i}"] = NodeView(f"n{i}", {}, KERNEL, "amd64", True)
    assert controller.reconcile(_module(), [], []) == module_controller.NEXT_SLICE_SECONDS
    # The watch shows the first slice's two pods, one of them ready by now.
    made = [loader_pod_view(pod) for pod in kube.created]
    assert len(made) == 2
    ready = replace(made[0], ready=True)
    kube.calls.clear()
    kube.created.clear()
    requeue = controller.reconcile(_module(), [ready, made[1]], [])
    writes = [c for c in kube.calls if c[0] in ("label_node", "create")]
    assert writes[0] == ("label_node", ready.node)
    assert [c[0] for c in writes[1:]] == ["create", "create"]
    assert requeue == module_controller.NEXT_SLICE_SECONDS
    first = {c[1] for c in writes[1:]}
    # Given time, the next pass creates the rest (not those sent, which the watch has not
    # shown yet) and asks for no early pass.
    monkeypatch.setattr(module_controller, "CREATE_SLICE_SECONDS", 60.0)
    kube.calls.clear()
    again = controller.reconcile(_module(), [ready, made[1]], [])
    assert again != module_controller.NEXT_SLICE_SECONDS
    rest = {c[1] for c in kube.calls if c[0] == "create"}
    assert len(rest) == 1 and not rest & (first | {p.name for p in made})
