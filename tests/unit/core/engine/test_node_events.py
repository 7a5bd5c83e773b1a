"""Which per-node decisions of a pass are told as Events."""

from __future__ import annotations

from kmodkit.core.engine.loader_plan import LoaderPlan, NodeOutcome, Phase
from kmodkit.core.engine.node_events import UNLOAD_HELD, NodeDecision, node_decisions


def test_failed_nodes_warn_held_unloads_inform_and_progress_is_not_told() -> None:
    p = LoaderPlan(
        outcomes=[
            NodeOutcome("a", Phase.FAILED, "UnloadFailed", "unloading failed: pid 42 holds xe"),
            NodeOutcome("b", Phase.LOADED, "Loaded"),
            NodeOutcome("c", Phase.UPDATING, "UpdatePending", "waiting for the rollout budget"),
            NodeOutcome("d", Phase.FAILED, "ImageMissing", "r.io/xe:1 does not exist"),
        ],
        held={"e": ("kube-system/dp-1", "ml/train-0")},
    )
    assert node_decisions(p) == [
        NodeDecision("a", "UnloadFailed", "unloading failed: pid 42 holds xe", warning=True),
        NodeDecision("d", "ImageMissing", "r.io/xe:1 does not exist", warning=True),
        NodeDecision(
            "e",
            UNLOAD_HELD,
            "the module is not unloaded while pods gated on its readiness label run: "
            "kube-system/dp-1, ml/train-0",
            warning=False,
        ),
    ]
