"""A driver policy taking many nodes over costs a pass time linear in the fleet (issue: fleet
scale).

While another policy's builders linger on the nodes, the new owner's DaemonSet keeps each of
them off by name, one ``metadata.name NotIn`` field per node. Each pass asks, for every node,
whether that DaemonSet places a builder there: scanning every field for every node made the
pass quadratic in the nodes held back (about 0.1 s at 1,000 nodes, 0.37 s at 2,000).
"""

from __future__ import annotations

from typing import Any

import pytest

from kmodkit.backends.tenstorrent import driver_plan, owned_affinity
from kmodkit.backends.tenstorrent.driver_owners import ownership
from kmodkit.backends.tenstorrent.keys import TT_DRIVER_SKIP_LABEL
from tests.unit.backends.tenstorrent.test_tt_driver_owners import (
    NOW,
    OLDER,
    _builder,
    _ds,
    _node,
    _terms,
    _view,
)

NODES = 300


def test_a_pass_holding_every_node_back_checks_each_node_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = [_node(f"n{i:04d}", pool="tt") for i in range(NODES)]
    lingering = [_builder("deleted", n.name) for n in nodes]  # a deleted policy's builders
    first = driver_plan.plan_at(OLDER, _view(nodes, [OLDER], pods=lingering), NOW)
    ds = _ds(first)
    assert len(_terms(ds)[0]["matchFields"]) == NODES, "every node is held back by name"

    calls = 0
    real = owned_affinity._expression_holds

    def counted(expr: Any, value: str | None) -> bool:
        nonlocal calls
        calls += 1
        return real(expr, value)

    monkeypatch.setattr(owned_affinity, "_expression_holds", counted)
    own = ownership(
        OLDER, _view(nodes, [OLDER], pods=lingering, owned=[ds]), TT_DRIVER_SKIP_LABEL, True
    )
    assert set(own.held) == {n.name for n in nodes}
    assert calls <= 20 * NODES, f"{calls} selector checks for {NODES} nodes"
