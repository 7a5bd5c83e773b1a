"""A backend's pass waits for the node cache, as a Module's does; its watches wake its
resource's objects as declared (no other controller's), and what it owns wakes its owner alone.

The Kube here is a stand-in with no methods: a pass that went on would reach it
(to apply objects or write status) and fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import kopf
from pydantic import BaseModel

from kmodkit.core.contract.backend import ClusterView, OwnedKind, Plan, Resource, Watch
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime.informer_cache import Change, InformerCache
from kmodkit.core.runtime.resource_controller import OWNER_UID_LABEL, ResourceController
from kmodkit.core.runtime.watch_cache import CACHE_WAIT_SECONDS, Shared
from kmodkit.core.schema.crd import CrdSource
from tests.unit.core.runtime.daemon_stopped import Stopped


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
    also = shared.wakeups.event(("backend", "acme.example.com", "widgets", "uid-2"))
    # Other controllers' loops: their plans do not read these pods.
    other_kind = shared.wakeups.event(("backend", "acme.example.com", "gadgets", "uid-3"))
    module = shared.wakeups.event(("modules", "ns", "m"))
    raw = {"metadata": {"name": "p", "namespace": "n", "managedFields": [{"manager": "x"}]}}
    sets.subscriber([Change(("n", "ds"), None, sets.view({"metadata": {"name": "ds"}}))])
    assert not woken.is_set()
    pods.subscriber([Change(("n", "p"), None, pods.view(raw))])
    assert woken.is_set() and also.is_set()
    assert not other_kind.is_set() and not module.is_set()
    assert controller._watched() == {
        "pods": [{"metadata": {"name": "p", "namespace": "n"}}],
        "sets": [{"metadata": {"name": "ds"}}],
    }
    pods.forget()
    assert controller._watched()["pods"] == []


def test_a_watch_naming_its_fields_keeps_those_and_wakes_for_no_other() -> None:
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    fields = ("metadata.name", "spec.nodeName", "status.containerStatuses[].state")
    watch = Watch(name="pods", group="", version="v1", plural="pods", fields=fields)
    resource = Resource(crd=crd, model=Empty, plan=lambda _b, _v: Plan(), watches=(watch,))
    ResourceController("acme", resource, shared).register(kopf.OperatorRegistry())
    (spec,) = shared.watches
    cache = InformerCache(spec.view)

    def pod(rv: str, image: str, state: str) -> Obj:
        return {
            "metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": rv},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": image}]},
            "status": {"containerStatuses": [{"name": "c", "image": image, "state": state}]},
        }

    added = cache.apply("ADDED", pod("1", "a", "waiting"))
    assert added is not None and added.new[1] == {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n1"},
        "status": {"containerStatuses": [{"state": "waiting"}]},
    }
    assert cache.apply("MODIFIED", pod("2", "b", "waiting")) is None  # nothing kept moved
    assert cache.apply("MODIFIED", pod("3", "b", "running")) is not None


def test_owned_kinds_are_informers_selecting_the_owner_uid_and_wake_only_their_owner() -> None:
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    owns = (
        OwnedKind("v1", "ConfigMap", "configmaps"),
        OwnedKind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    )
    resource = Resource(crd=crd, model=Empty, plan=lambda _b, _v: Plan(), owns=owns)
    registry = kopf.OperatorRegistry()
    controller = ResourceController("acme", resource, shared)
    controller.register(registry)
    # kopf would watch every ConfigMap of the cluster and filter them here.
    assert not [str(h.id) for h in registry._indexing.get_all_handlers()]
    specs = {spec.name: spec for spec in shared.watches}
    maps, roles = specs["acme.widgets.owned.configmap"], specs["acme.widgets.owned.clusterrole"]
    assert maps.label_selector == roles.label_selector == OWNER_UID_LABEL

    def owned(name: str, uid: str) -> Obj:
        """As the informer delivers it: with its kind (a list's items are given theirs)."""
        meta = {"name": name, "labels": {OWNER_UID_LABEL: uid}, "managedFields": []}
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
        }

    mine = shared.wakeups.event(("backend", "acme.example.com", "widgets", "uid-1"))
    theirs = shared.wakeups.event(("backend", "acme.example.com", "widgets", "uid-2"))
    maps.subscriber([Change(("n", "c1"), None, maps.view(owned("c1", "uid-1")))])
    roles.subscriber([Change(("", "r2"), None, roles.view(owned("r2", "uid-2")))])
    assert mine.is_set() and theirs.is_set()
    mine.clear()
    theirs.clear()
    roles.subscriber([Change(("", "r1"), None, roles.view(owned("r1", "uid-1")))])
    assert mine.is_set() and not theirs.is_set()
    assert [o["metadata"]["name"] for o in controller._owned("uid-1")] == ["c1", "r1"]
    assert [o["metadata"]["name"] for o in controller._owned("uid-2")] == ["r2"]
    (role,) = controller._owned("uid-2")
    # Pruning names the kind.
    assert "managedFields" not in role["metadata"]
    assert (role["apiVersion"], role["kind"]) == ("rbac.authorization.k8s.io/v1", "ClusterRole")
    old = roles.view(owned("r2", "uid-2"))
    roles.subscriber([Change(("", "r2"), old, None)])
    assert theirs.is_set() and controller._owned("uid-2") == []
    maps.forget()
    assert [o["metadata"]["name"] for o in controller._owned("uid-1")] == ["r1"]


def test_a_resource_naming_the_node_labels_it_reads_is_woken_by_no_other_label() -> None:
    """The object's daemon runs (its pass plans nothing: the node cache is not synced) and
    nodes move under it."""
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    given: list[dict[str, Any]] = []

    def node_labels(body: Obj, watched: Mapping[str, Sequence[Obj]]) -> Callable[[str], bool]:
        given.append(dict(watched))
        return lambda key: key == body["spec"]["reads"]

    resource = Resource(
        crd=crd,
        model=Empty,
        plan=lambda _b, _v: Plan(),
        watches=(Watch(name="pods", group="", version="v1", plural="pods"),),
        hooks=lambda *_: None,  # type: ignore[arg-type,return-value]
        node_labels=node_labels,
    )
    registry = kopf.OperatorRegistry()
    ResourceController("acme", resource, shared).register(registry)
    (daemon,) = registry._spawning.get_all_handlers()
    (pods,) = shared.watches
    meta = {"name": "w", "uid": "u1", "resourceVersion": "1"}
    body = {"metadata": meta, "spec": {"reads": "acme.example.com/v"}}
    plain = NodeView("n1", labels={"zone": "a"})

    def wakes(**labels: str) -> bool:
        event = shared.wakeups.event(("backend", "acme.example.com", "widgets", "u1"))
        event.clear()
        shared.wakeups.wake_for_nodes([(plain, replace(plain, labels=labels))])
        return event.is_set()

    async def run() -> None:
        stopped = Stopped()
        task = asyncio.create_task(daemon.fn(uid="u1", body=body, stopped=stopped))
        await asyncio.sleep(0.1)
        assert not wakes(zone="b", **{"kmm.node.kubernetes.io/ns.m.ready": ""})
        assert wakes(zone="a", **{"acme.example.com/v": "2"})
        # The rollout's own labels, on the nodes of any resource with hooks.
        assert wakes(zone="a", **{"rollout.kmodkit.io/acme-w": "draining"})
        # Read as the object is now (a change comes with a new resourceVersion).
        body["spec"]["reads"] = "acme.example.com/w"
        body["metadata"]["resourceVersion"] = "2"
        assert not wakes(zone="a", **{"acme.example.com/v": "2"})
        assert wakes(zone="a", **{"acme.example.com/w": "2"})
        assert given[0] == {"pods": []}  # with what its watches hold
        # Made once per object and watch contents, not at every batch of node changes.
        assert len(given) == 2
        pods.subscriber([Change(("n", "p"), None, pods.view({"metadata": {"name": "p"}}))])
        wakes(zone="a", **{"acme.example.com/w": "3"})
        assert len(given) == 3 and given[2] == {"pods": [{"metadata": {"name": "p"}}]}
        stopped.set()
        await task

    asyncio.run(run())
