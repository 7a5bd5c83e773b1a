"""A rollout pass applies its nodes' steps side by side (``concurrently``), against the
fake core API of ``test_rollout_reconcile``: the same outcome as one by one, the starts
only after the other steps, and the backend's swap hook never called twice at once."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import pytest

from kmodkit.core.contract.hooks import Obj
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout import reconcile as reconcile_module
from kmodkit.core.rollout.reconcile import one_by_one, reconcile
from kmodkit.core.rollout.status import RolloutStatus
from tests.unit.core.rollout.test_rollout_reconcile import (
    KEYS,
    NOW,
    POLICY,
    TARGET,
    FakeCore,
    Hooks,
    _node,
    swapping,
)

SWAPPING = [f"s{i}" for i in range(8)]
REQUIRED = [f"r{i}" for i in range(4)]


def _fleet() -> list[Obj]:
    """Nodes in ``swapping`` (each swaps and moves on) and nodes waiting to start."""
    nodes = []
    for name in SWAPPING:
        node = swapping(rv="7")
        node["metadata"].update(name=name, uid=str(uuid.uuid4()))
        nodes.append(node)
    return nodes + [_node(name, "required") for name in REQUIRED]


class OneSwapAtATime(Hooks):
    """Records how many swaps ran at once; each takes a little while."""

    def __init__(self, core: FakeCore) -> None:
        super().__init__(core)
        self.active = self.most = 0
        self.lock = threading.Lock()

    def swap(self, node: Obj) -> None:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.02)
        super().swap(node)
        with self.lock:
            self.active -= 1


class AllAtOnce:
    """Runs a batch's calls each on a thread of its own, all started before any goes on;
    records the batches."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def __call__(self, calls: Sequence[Callable[[], None]]) -> None:
        self.batches.append(len(calls))
        gate = threading.Barrier(len(calls))

        def run(call: Callable[[], None]) -> None:
            gate.wait(5)
            call()

        threads = [threading.Thread(target=run, args=(c,)) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)


def _pass(
    monkeypatch: pytest.MonkeyPatch, concurrently: Callable[[Sequence[Callable[[], None]]], None]
) -> tuple[RolloutStatus, FakeCore, OneSwapAtATime]:
    nodes = _fleet()
    core = FakeCore(*nodes)
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    hooks = OneSwapAtATime(core)
    policy = UpgradePolicy(
        validation_timeout_seconds=600, max_parallel=len(nodes), max_unavailable=len(nodes)
    )
    status = reconcile(
        None,
        POLICY,
        policy,
        copy.deepcopy(nodes),
        hooks,
        target=TARGET,
        now=NOW + 5,
        concurrently=concurrently,
    )
    return status, core, hooks


def _states(core: FakeCore) -> dict[str, str]:
    return {name: n["metadata"]["labels"].get(KEYS.state, "") for name, n in core.nodes.items()}


def test_steps_applied_side_by_side_end_as_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    alone, core_alone, _ = _pass(monkeypatch, one_by_one)
    together, core, _ = _pass(monkeypatch, AllAtOnce())
    assert _states(core) == _states(core_alone)
    assert set(_states(core).values()) == {"validating", "cordoning"}, _states(core)
    assert (together.transitions, together.writes, together.errors) == (
        alone.transitions,
        alone.writes,
        alone.errors,
    )
    assert sorted(n for kind, n in core.calls if kind == "swap") == SWAPPING
    # Each node's step counted in the pass's status: a swap is two writes, a start one.
    assert sum(together.transitions.values()) == len(SWAPPING) + len(REQUIRED)
    assert together.writes == 2 * len(SWAPPING) + len(REQUIRED)


def test_the_starts_follow_the_other_steps_and_swaps_come_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    concurrently = AllAtOnce()
    _pass(monkeypatch, concurrently)
    # The swapping nodes' moves, then the starts: the in-flight count the starts are
    # checked against includes what the first batch moved.
    assert concurrently.batches == [len(SWAPPING), len(REQUIRED)]
    _, _, hooks = _pass(monkeypatch, AllAtOnce())
    assert hooks.most == 1
