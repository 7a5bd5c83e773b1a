"""A backend's pass applies an owned object only when the cache shows it differing from
the plan: a converged policy makes no write a pass, and drift is put back.

The Kube and the dynamic client are stand-ins (no API server) that record the status
writes and server-side applies the controller makes; the tests play the owned-object
cache by handing ``reconcile`` what the informer would hold.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes import client
from pydantic import BaseModel

from kmodkit.core.applied import holds
from kmodkit.core.contract.backend import ClusterView, Plan, Resource, RolloutRequest
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.runtime import resource_controller
from kmodkit.core.runtime.kube import Kube
from kmodkit.core.runtime.resource_controller import ResourceController
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import WritePool, WriteSettings
from kmodkit.core.schema.crd import CrdSource


class Empty(BaseModel):
    pass


class StatusKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: takes status writes and Events."""

    def write_status(self, *_: Any) -> None:
        """Not what these tests pin."""

    @property
    def events(self) -> StatusKube:
        return self

    def post(self, *_: Any, **__: Any) -> bool:
        return True


class Applies:
    """Stand-in for a dynamic client's resource: records each server-side apply."""

    def __init__(self) -> None:
        self.bodies: list[Obj] = []

    def server_side_apply(self, body: Obj, **_: Any) -> None:
        self.bodies.append(body)


CONFIG = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "widget-config", "namespace": "kmodkit-system"},
    "data": {"version": "2.8.0"},
}
BODY = {
    "apiVersion": "acme.example.com/v1",
    "kind": "Widget",
    "metadata": {"name": "w", "uid": "widget-uid"},
}


def _controller(planned: list[Obj] | None = None) -> tuple[ResourceController, Applies]:
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")

    def plan(body: Obj, view: ClusterView) -> Plan:
        return Plan(objects=list(planned or [CONFIG]))

    shared = Shared(kube=StatusKube(), operator_namespace="kmodkit-system", nodes_synced=True)  # type: ignore[arg-type]
    controller = ResourceController("acme", Resource(crd=crd, model=Empty, plan=plan), shared)
    applies = Applies()
    controller._resource_for = lambda _obj: applies  # type: ignore[method-assign]
    return controller, applies


def _as_stored(applied: Obj, **changes: Any) -> Obj:
    """What the owned informer holds once the apply landed: the apiserver's own fields added."""
    meta = {**applied["metadata"], "uid": "cm-uid", "resourceVersion": "7", "generation": 1}
    return {**applied, "metadata": meta, **changes}


def test_a_converged_policy_applies_nothing_and_drift_is_applied_back() -> None:
    controller, applies = _controller()
    controller.reconcile(dict(BODY), {}, [])
    assert [b["data"] for b in applies.bodies] == [{"version": "2.8.0"}]
    stored = _as_stored(applies.bodies[0])

    for _ in range(3):
        controller.reconcile(dict(BODY), {}, [stored])
    assert len(applies.bodies) == 1  # the cache shows it as applied: no write

    edited = _as_stored(applies.bodies[0], data={"version": "2.7.0"})
    controller.reconcile(dict(BODY), {}, [edited])
    assert [b["data"] for b in applies.bodies] == [{"version": "2.8.0"}] * 2

    relabelled = _as_stored(applies.bodies[0])
    relabelled["metadata"] = {**relabelled["metadata"], "labels": {"someone": "else"}}
    controller.reconcile(dict(BODY), {}, [relabelled])
    assert len(applies.bodies) == 3  # the owner's labels went: applied again


def test_what_the_apiserver_adds_is_held_and_what_differs_is_not() -> None:
    desired = {"spec": {"containers": [{"name": "c", "image": "i:1"}], "replicas": 1}}
    defaulted = {
        "spec": {
            "containers": [{"name": "c", "image": "i:1", "imagePullPolicy": "IfNotPresent"}],
            "replicas": 1,
            "revisionHistoryLimit": 10,
        }
    }
    assert holds(defaulted, desired)
    assert not holds({"spec": {"containers": [], "replicas": 1}}, desired)
    two = [{"name": "c", "image": "i:1"}, {"name": "d", "image": "i:1"}]
    assert not holds({"spec": {"containers": two, "replicas": 1}}, desired)
    assert not holds(
        {"spec": {"containers": desired["spec"]["containers"], "replicas": "1"}}, desired
    )
    assert not holds({"spec": {"containers": desired["spec"]["containers"]}}, desired)
    assert not holds(None, desired)


def test_a_field_set_empty_is_held_by_its_absence() -> None:
    """The apiserver stores a field set to an empty list, map or string, zero or false as
    no field at all: an Intel device plugin DaemonSet (``args: []``, ``tolerations: []``)
    was applied on every pass until this held."""
    empty = {"args": [], "tolerations": [], "labels": {}, "sub": "", "off": False, "n": 0}
    desired = {"spec": {**empty, "gone": None, "image": "i:1"}}
    assert holds({"spec": {"image": "i:1"}}, desired)
    assert holds({"spec": {**empty, "image": "i:1"}}, desired)
    assert not holds({"spec": {"image": "i:1", "args": ["-v"]}}, desired)
    assert not holds({"spec": {"image": "i:1", "off": True}}, desired)
    assert not holds({"spec": {}}, desired)


def test_a_key_the_plan_no_longer_sets_is_applied_away() -> None:
    # The object still holds every key planned now, but an apply is what removes the
    # key it stopped planning: the stamp of the applied body tells the two apart.
    planned = [{**CONFIG, "data": {"version": "2.8.0", "proxy": "http://proxy:3128"}}]
    controller, applies = _controller(planned)
    controller.reconcile(dict(BODY), {}, [])
    stored = _as_stored(applies.bodies[0])
    planned[0] = CONFIG
    controller.reconcile(dict(BODY), {}, [stored])
    assert [b["data"] for b in applies.bodies][1:] == [{"version": "2.8.0"}]
    controller.reconcile(dict(BODY), {}, [_as_stored(applies.bodies[1])])
    assert len(applies.bodies) == 2


class RebuildingDiscovery:
    """Stand-in for the dynamic client (``.resources.get``) replaying its discovery's lack
    of thread safety: the first lookup misses and rebuilds the cache in place for 0.2 s,
    and a lookup meanwhile raises KeyError 'resources', as the real one does."""

    def __init__(self) -> None:
        self.resources = self
        self.cache: dict[str, Any] = {"resources": {}}
        self.rebuilding = threading.Event()

    def get(self, **_: Any) -> Any:
        if not self.rebuilding.is_set():
            self.cache = {}
            self.rebuilding.set()
            time.sleep(0.2)
            self.cache = {"resources": {}}
        return self.cache["resources"]


def test_passes_of_two_objects_look_their_kinds_up_one_at_a_time() -> None:
    api = client.ApiClient(client.Configuration(host="https://stand-in.invalid"))
    kube = Kube(api, WriteSettings())
    discovery = kube._dynamic = RebuildingDiscovery()
    failures: list[BaseException] = []

    def look_up() -> None:
        try:
            kube.resource(CONFIG["apiVersion"], CONFIG["kind"])
        except Exception as err:
            failures.append(err)

    first = threading.Thread(target=look_up)
    first.start()
    assert discovery.rebuilding.wait(5)
    look_up()  # the other object's pass, while the first one's lookup rebuilds
    first.join()
    assert failures == []


class PoolKube(StatusKube):
    """StatusKube with the process's write pool, as Kube has it."""

    api = None

    def __init__(self) -> None:
        self.writes = WritePool(4, str)  # made by the test that uses it, not on import


def test_a_rollout_pass_applies_its_steps_in_the_write_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fleet's rollout moves hundreds of nodes a pass: their steps go to the pool that
    bounds the process's writes in flight, not one after another on the pass's thread."""
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    request = RolloutRequest("acme.w", UpgradePolicy(), nodes=[], target="v1")
    resource = Resource(
        crd=crd,
        model=Empty,
        plan=lambda _body, _view: Plan(rollout=request),
        hooks=lambda _body, _view, _api: None,
    )
    shared = Shared(kube=PoolKube(), operator_namespace="kmodkit-system", nodes_synced=True)  # type: ignore[arg-type]
    ran_on: list[str] = []

    def rollout_pass(*args: Any, concurrently: Any, **kwargs: Any) -> Any:
        concurrently([lambda: ran_on.append(threading.current_thread().name)] * 3)
        return real_pass(*args, concurrently=concurrently, **kwargs)

    real_pass = resource_controller.rollout_pass
    monkeypatch.setattr(resource_controller, "rollout_pass", rollout_pass)
    ResourceController("acme", resource, shared).reconcile(dict(BODY), {}, [])
    assert len(ran_on) == 3
    assert all(name.startswith("kmodkit-write") for name in ran_on), ran_on
