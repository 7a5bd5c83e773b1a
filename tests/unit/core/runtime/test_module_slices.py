"""A pass creates loader pods for one slice of time, and labels the ready nodes first.

So a new Module over a large fleet labels its first nodes while the rest of their pods
are still being created, instead of after all of them. The Kube is the recording
stand-in of test_module_builds (no API server); the clock is a variable.
"""

from __future__ import annotations

import threading
import time
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
from tests.unit.core.runtime.test_module_builds import (
    KERNEL,
    NAME,
    NS,
    RecordingKube,
    _controller,
)
from tests.unit.core.runtime.test_module_builds import _module as builds_module

READY = f"kmm.node.kubernetes.io/{NS}.{NAME}.ready"


def _module() -> dict[str, Any]:
    """test_module_builds' Module, its image already pushed: no build."""
    body = builds_module()
    for mapping in body["spec"]["moduleLoader"]["container"]["kernelMappings"]:
        mapping.pop("build")
    return body


def test_run_for_starts_writes_as_others_end_until_its_time_is_up() -> None:
    pool = WritePool(1, api_message)
    now = [0.0]
    done: list[int] = []

    def write(i: int) -> None:
        done.append(i)
        now[0] += 1.0  # each write takes a second

    writes = [Write(f"w{i}", lambda i=i: write(i)) for i in range(10)]
    # One in flight: each starts when the one before ends; none starts 2.5 s after the start.
    assert pool.run_for(writes, 2.5, clock=lambda: now[0]) == [None] * 3
    assert done == [0, 1, 2]
    # The first always starts, however short the time; given time, all do.
    assert len(pool.run_for(writes, 0, clock=lambda: now[0])) == 1
    assert len(pool.run_for(writes, 60)) == 10


def test_run_for_keeps_the_pool_full_rather_than_waiting_for_the_slowest() -> None:
    pool = WritePool(4, api_message)
    slow = threading.Event()
    started: list[int] = []

    def write(i: int) -> None:
        started.append(i)
        if i == 0:
            slow.wait(10)  # one write throttled for long

    writes = [Write(f"w{i}", lambda i=i: write(i)) for i in range(12)]
    runner = threading.Thread(target=pool.run_for, args=(writes, 60))
    runner.start()
    deadline = time.monotonic() + 5
    while len(started) < 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    # The other eleven went through the three free slots while the first one hung.
    assert sorted(started) == list(range(12))
    slow.set()
    runner.join(10)


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
    # No time: the first creation only; only its node's old pod goes.
    assert failures == [] and cut_short
    assert [c[1] for c in kube.calls if c[0] == "create"] == ["new-n0"]
    assert deleted == ["old-n0"]
    assert not unseen.unseen(("pod", "new-n1"))


def test_a_pass_labels_ready_nodes_before_it_creates_and_comes_back_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(module_controller, "CREATE_SLICE_SECONDS", 0.0)
    kube = RecordingKube()
    controller = _controller(kube, Existence.EXISTS)
    for i in range(2, 6):
        controller.shared.nodes[f"n{i}"] = NodeView(f"n{i}", {}, KERNEL, "amd64", True)
    assert controller.reconcile(_module(), [], []) == module_controller.NEXT_SLICE_SECONDS
    # The watch shows the first slice's pod (no time: one), ready by now.
    (made,) = [loader_pod_view(pod) for pod in kube.created]
    ready = replace(made, ready=True)
    kube.calls.clear()
    kube.created.clear()
    requeue = controller.reconcile(_module(), [ready], [])
    writes = [c for c in kube.calls if c[0] in ("label_node", "create")]
    assert writes[0] == ("label_node", ready.node)
    assert [c[0] for c in writes[1:]] == ["create"]
    assert requeue == module_controller.NEXT_SLICE_SECONDS
    sent = writes[1][1]
    # Given time, the next pass creates the rest (not the one sent, which the watch has not
    # shown yet) and asks for no early pass.
    monkeypatch.setattr(module_controller, "CREATE_SLICE_SECONDS", 60.0)
    kube.calls.clear()
    again = controller.reconcile(_module(), [ready], [])
    assert again != module_controller.NEXT_SLICE_SECONDS
    rest = {c[1] for c in kube.calls if c[0] == "create"}
    assert len(rest) == 3 and not rest & {sent, made.name}


def test_a_waves_nodes_are_asked_for_their_gated_pods_side_by_side() -> None:
    kube = RecordingKube()
    together = threading.Barrier(4, timeout=5)

    def pods_on_node(node: str) -> list[dict[str, Any]]:
        together.wait()  # four reads at once, or none gets past
        return [] if node != "n2" else [_gated("w", node)]

    kube.pods_on_node = pods_on_node  # type: ignore[attr-defined]
    controller = _controller(kube, Existence.EXISTS)
    nodes = [f"n{i}" for i in range(8)]
    assert controller._consumers(nodes, NS, NAME) == {
        n: ([f"{NS}/w"] if n == "n2" else []) for n in nodes
    }


def _gated(name: str, node: str) -> dict[str, Any]:
    """A pod that runs only where the Module's ready label is."""
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node, "nodeSelector": {READY: ""}},
    }
