"""A backend's pass waits for the node cache, as a Module's does; its watches wake it as declared.

The Kube here is a stand-in with no methods: a pass that went on would reach it
(to apply objects or write status) and fail.
"""

from __future__ import annotations

import kopf
from pydantic import BaseModel

from kmodkit.core.contract.backend import ClusterView, Plan, Resource, Watch
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.runtime.resource_controller import ResourceController
from kmodkit.core.runtime.watch_cache import CACHE_WAIT_SECONDS, Shared
from kmodkit.core.schema.crd import CrdSource


class Empty(BaseModel):
    pass


class NoKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube that nothing may call."""


def test_a_backend_pass_on_an_unsynced_node_cache_plans_nothing() -> None:
    planned: list[ClusterView] = []

    def plan(body: Obj, view: ClusterView) -> Plan:
        planned.append(view)
        return Plan()

    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    controller = ResourceController("acme", Resource(crd=crd, model=Empty, plan=plan), shared)
    body = {"apiVersion": "acme.example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}

    assert controller.reconcile(body, {}, []) == CACHE_WAIT_SECONDS
    assert planned == []


def test_a_watch_that_does_not_wake_is_indexed_but_replans_nothing() -> None:
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    watches = (
        Watch(name="pods", group="", version="v1", plural="pods"),
        Watch(name="sets", group="apps", version="v1", plural="daemonsets", wakes=False),
    )
    resource = Resource(crd=crd, model=Empty, plan=lambda _b, _v: Plan(), watches=watches)
    registry = kopf.OperatorRegistry()
    ResourceController("acme", resource, shared).register(registry)
    indexed = {str(h.id) for h in registry._indexing.get_all_handlers()}
    on_event = {str(h.id) for h in registry._watching.get_all_handlers()}
    assert {"acme.widgets.watch.pods", "acme.widgets.watch.sets"} <= indexed
    assert "acme.widgets.watch.pods.event" in on_event
    assert "acme.widgets.watch.sets.event" not in on_event
