"""A backend's pass waits for the node cache, as a Module's does; its watches wake it as declared.

The Kube here is a stand-in with no methods: a pass that went on would reach it
(to apply objects or write status) and fail.
"""

from __future__ import annotations

import kopf
from pydantic import BaseModel

from kmodkit.core.contract.backend import ClusterView, Plan, Resource, Watch
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.runtime.informer_cache import Change
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


def test_watches_are_informers_with_server_side_selectors_and_wake_as_declared() -> None:
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    watches = (
        Watch(name="pods", group="", version="v1", plural="pods", labels={"app": "a", "b": "c"}),
        Watch(name="sets", group="apps", version="v1", plural="daemonsets", wakes=False),
    )
    resource = Resource(crd=crd, model=Empty, plan=lambda _b, _v: Plan(), watches=watches)
    registry = kopf.OperatorRegistry()
    controller = ResourceController("acme", resource, shared)
    controller.register(registry)
    # Nothing of them is left to kopf, which would watch every pod and filter here.
    assert not [str(h.id) for h in registry._indexing.get_all_handlers() if ".watch." in h.id]
    specs = {spec.name: spec for spec in shared.watches}
    pods, sets = specs["acme.widgets.watch.pods"], specs["acme.widgets.watch.sets"]
    assert (pods.label_selector, sets.label_selector) == ("app=a,b=c", "")

    woken = shared.wakeups.event(("backend", "acme.example.com", "widgets", "uid-1"))
    raw = {"metadata": {"name": "p", "namespace": "n", "managedFields": [{"manager": "x"}]}}
    sets.subscriber([Change(("n", "ds"), None, sets.view({"metadata": {"name": "ds"}}))])
    assert not woken.is_set()
    pods.subscriber([Change(("n", "p"), None, pods.view(raw))])
    assert woken.is_set()
    assert controller._watched() == {
        "pods": [{"metadata": {"name": "p", "namespace": "n"}}],
        "sets": [{"metadata": {"name": "ds"}}],
    }
    pods.forget()
    assert controller._watched()["pods"] == []
