"""The engine's per-node decisions worth an Event, from a pass's plan (pure).

Loads and unloads are posted where they happen (when the readiness label
changes). What is decided here are conditions that hold over many passes: a
node that failed (a load or unload refused, a build failed, a mapping that
cannot serve it) and an unload held back while pods still use the module.
The controller posts each on the node and on the Module, reported again only
while it holds and at most every few minutes (``kmodkit.core.events``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kmodkit.core.engine.loader_plan import LoaderPlan, Phase

UNLOAD_HELD = "UnloadHeld"


@dataclass(frozen=True)
class NodeDecision:
    node: str
    reason: str
    message: str
    warning: bool


def node_decisions(plan: LoaderPlan) -> list[NodeDecision]:
    failed = [
        NodeDecision(o.node, o.reason, o.message, warning=True)
        for o in plan.outcomes
        if o.phase is Phase.FAILED
    ]
    held = [
        NodeDecision(
            node,
            UNLOAD_HELD,
            "the module is not unloaded while pods gated on its readiness label run: "
            + ", ".join(pods),
            warning=False,
        )
        for node, pods in sorted(plan.held.items())
    ]
    return failed + held
