"""Deleting a Module unloads only nodes whose readiness labels it has taken away.

The Kube here is a stand-in that records the calls the controller makes (no API
server), and the tests play the watch by updating the node cache: these tests
pin the controller's decision of what to unlabel, create and delete on a node
cache that is still filling, not the API's behaviour.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from kmodkit.core import labels
from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit.core.engine.loader_pod import (
    COMPONENT_LABEL,
    UNLOADER_COMPONENT,
    LoaderPod,
    LoaderSettings,
    loader_pod_view,
)
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.watch_cache import CACHE_WAIT_SECONDS, Shared
from kmodkit.core.runtime.writes import WritePool

NS, NAME, KERNEL = "drivers", "xe", "6.8.0-45-generic"
READY = labels.READY.key(NS, NAME)
BODY = {
    "apiVersion": "kmodkit.io/v1alpha1",
    "kind": "Module",
    "metadata": {"name": NAME, "namespace": NS, "uid": "module-uid"},
    "spec": {
        "selector": {},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "xe"},
                "kernelMappings": [{"regexp": ".*", "containerImage": "r.io/xe:1"}],
            }
        },
    },
}


class RecordingKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: records what the controller writes."""

    def __init__(self) -> None:
        # One write at a time, as recorded: the order the pass hands them over.
        self.writes = WritePool(1, api_message)
        self.labelled: list[tuple[str, dict[str, str | None]]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.posted: list[tuple[str, str, str]] = []
        """(involved object's name, reason, message) of each Event."""
        self.refuse_deletes: set[str] = set()

    def write_status(self, *args: Any) -> None:
        """Not what these tests pin (tests/integration/test_engine.py reads it back)."""

    def label_node(self, node: str, change: Mapping[str, str | None]) -> None:
        self.labelled.append((node, dict(change)))

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    def create(self, obj: Mapping[str, Any]) -> None:
        self.created.append(dict(obj))

    def delete_pod(self, namespace: str, name: str) -> None:
        if name in self.refuse_deletes:
            raise ApiException(status=403, reason="Forbidden")
        self.deleted.append(name)

    @property
    def events(self) -> RecordingKube:
        return self

    def post(self, involved: Mapping[str, Any], reason: str, message: str, **_: Any) -> bool:
        self.posted.append((involved["name"], reason, message))
        return True


def _controller(kube: RecordingKube, seen: list[str], synced: bool = True) -> ModuleController:
    shared = Shared(kube=kube, operator_namespace="kmodkit-system", nodes_synced=synced)  # type: ignore[arg-type]
    for name in seen:
        shared.nodes[name] = NodeView(name, {READY: ""}, KERNEL)
    settings = ModuleControllerSettings(
        loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
        build=BuildSettings(builder_image="registry.example.com/builder:1"),
    )
    return ModuleController(shared, settings)


def _pod(node: str) -> LoaderPod:
    return LoaderPod(
        f"{NAME}-loader-{node}", node, "hash", KERNEL, "", ready=True, leaves_loaded=True
    )


def _labels_gone(controller: ModuleController) -> None:
    """What the node watch reports once the label removals land."""
    for name, view in list(controller.nodes.items()):
        controller.nodes[name] = replace(view, labels={})


def _unloaders(kube: RecordingKube) -> list[str]:
    return sorted(
        p["spec"]["nodeName"]
        for p in kube.created
        if p["metadata"]["labels"][COMPONENT_LABEL] == UNLOADER_COMPONENT
    )


def test_a_pod_on_a_node_not_seen_yet_is_kept_until_the_node_is_seen() -> None:
    kube = RecordingKube()
    controller = _controller(kube, seen=["a"])
    pods = [_pod("a"), _pod("b")]
    with pytest.raises(kopf.TemporaryError, match=r"b \(node not seen yet\)"):
        controller.finalize(BODY, pods)
    # The label goes first; nothing unloads on that pass.
    assert kube.labelled == [("a", {READY: None})]
    assert (kube.created, kube.deleted) == ([], [])

    _labels_gone(controller)
    with pytest.raises(kopf.TemporaryError, match=r"b \(node not seen yet\)"):
        controller.finalize(BODY, pods)
    assert _unloaders(kube) == ["a"] and kube.deleted == [f"{NAME}-loader-a"]


def test_the_finalizer_stays_until_every_unloader_has_succeeded() -> None:
    kube = RecordingKube()
    controller = _controller(kube, seen=["a", "b"])
    _labels_gone(controller)
    with pytest.raises(kopf.TemporaryError, match="waiting for 2 nodes"):
        controller.finalize(BODY, [_pod("a"), _pod("b")])
    assert _unloaders(kube) == ["a", "b"]
    assert sorted(kube.deleted) == [f"{NAME}-loader-a", f"{NAME}-loader-b"]

    unloaders = [loader_pod_view({**p, "status": {"phase": "Running"}}) for p in kube.created]
    with pytest.raises(kopf.TemporaryError, match="waiting for 2 nodes"):
        controller.finalize(BODY, unloaders)
    done = [replace(unloaders[0], phase="Succeeded"), unloaders[1]]
    with pytest.raises(kopf.TemporaryError, match="waiting for 2 nodes"):
        controller.finalize(BODY, done)
    assert kube.deleted[-1] == unloaders[0].name
    controller.finalize(BODY, [])  # nothing left: the finalizer goes


def test_a_node_is_told_not_ready_when_its_label_goes_and_unloaded_when_its_unloader_succeeds() -> (
    None
):
    """The label goes long before the module does (gated pods leave first): the node's Event
    then says not ready, and ModuleUnloaded comes with the unloader's success, told once its
    record is deleted (a refused deletion tells nothing yet)."""
    kube = RecordingKube()
    controller = _controller(kube, seen=["a", "b"])
    with pytest.raises(kopf.TemporaryError):
        controller.finalize(BODY, [_pod("a"), _pod("b")])
    assert [(n, r) for n, r, _ in kube.posted] == [("a", "ModuleNotReady"), ("b", "ModuleNotReady")]
    assert kube.posted[0][2] == f"Module {NS}/{NAME} is no longer ready on this node"

    kube.posted.clear()
    _labels_gone(controller)
    with pytest.raises(kopf.TemporaryError):
        controller.finalize(BODY, [_pod("a"), _pod("b")])
    unloaders = [loader_pod_view({**p, "status": {"phase": "Running"}}) for p in kube.created]
    with pytest.raises(kopf.TemporaryError):
        controller.finalize(BODY, unloaders)
    assert kube.posted == []  # unloaders made and running: nothing is unloaded yet

    kube.refuse_deletes.add(unloaders[1].name)
    done = [replace(u, phase="Succeeded") for u in unloaders]
    with pytest.raises(kopf.TemporaryError):
        controller.finalize(BODY, done)
    assert kube.posted == [
        ("a", "ModuleUnloaded", f"Module {NS}/{NAME} unloaded from the kernel"),
        (NAME, "ApplyFailed", f"deleting Pod {NS}/{unloaders[1].name}: Forbidden"),
    ]


def test_nothing_is_planned_or_unloaded_before_the_node_cache_is_synced() -> None:
    # Start-up, failover, a watch restarted in-process: the cache is filling, and
    # a node it misses is not a node that is gone.
    kube = RecordingKube()
    controller = _controller(kube, seen=["a"], synced=False)
    _labels_gone(controller)
    assert controller.reconcile(dict(BODY), [_pod("a"), _pod("b")], []) == CACHE_WAIT_SECONDS
    with pytest.raises(kopf.TemporaryError, match="caches to fill"):
        controller.finalize(BODY, [_pod("a"), _pod("b")])
    assert (kube.labelled, kube.created, kube.deleted) == ([], [], [])


def test_finalize_works_on_one_snapshot_while_the_watch_changes_the_cache() -> None:
    # The node watch writes the cache from its own thread while a Module is deleted;
    # a pass iterating the live cache would fail ("dictionary changed size").
    kube = RecordingKube()
    controller = _controller(kube, seen=[f"n{i}" for i in range(300)])
    _labels_gone(controller)
    pods = [_pod(f"n{i}") for i in range(300)]
    stop = threading.Event()

    def watch() -> None:
        i = 0
        while not stop.is_set():
            controller.nodes[f"joined-{i}"] = NodeView(f"joined-{i}", {}, KERNEL)
            controller.nodes.pop(f"joined-{i - 1}", None)
            i += 1

    watcher = threading.Thread(target=watch, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so the watch writes mid-pass
    watcher.start()
    try:
        for _ in range(30):
            with pytest.raises(kopf.TemporaryError, match="waiting for 300 nodes"):
                controller.finalize(BODY, pods)
    finally:
        stop.set()
        watcher.join(timeout=5)
        sys.setswitchinterval(interval)


def _handed_over() -> dict[str, Any]:
    return {**BODY, "metadata": {**BODY["metadata"], "annotations": {labels.HANDED_OVER: "true"}}}


def test_a_module_handed_over_to_another_engine_goes_without_unloading() -> None:
    kube = RecordingKube()
    controller = _controller(kube, seen=["a", "b"])
    controller.finalize(_handed_over(), [_pod("a"), _pod("b")])  # no TemporaryError: it goes
    assert (kube.labelled, kube.created, kube.deleted) == ([], [], [])


def test_a_handover_waits_for_loader_pods_that_would_unload_when_deleted() -> None:
    kube = RecordingKube()
    controller = _controller(kube, seen=["a"])
    legacy = replace(_pod("a"), leaves_loaded=False)
    with pytest.raises(kopf.TemporaryError, match="cannot hand over: the loader pods on a"):
        controller.finalize(_handed_over(), [legacy])
    assert (kube.labelled, kube.created, kube.deleted) == ([], [], [])


def test_a_handover_waits_for_the_caches_to_fill() -> None:
    # The pods' cache still filling may not hold the loader pod that would unload when
    # deleted: going now would let the garbage collector delete it with the Module.
    kube = RecordingKube()
    controller = _controller(kube, seen=["a"], synced=False)
    with pytest.raises(kopf.TemporaryError, match="caches to fill"):
        controller.finalize(_handed_over(), [])


def test_an_unloader_deleted_but_not_yet_seen_gone_is_neither_deleted_nor_told_again() -> None:
    # The next pass may start before the watch shows the deletion (a large fleet, a
    # lagging watch): the unloader is deleted once, and the node told once.
    kube = RecordingKube()
    controller = _controller(kube, seen=["a"])
    _labels_gone(controller)
    with pytest.raises(kopf.TemporaryError):
        controller.finalize(BODY, [_pod("a")])
    done = [loader_pod_view({**p, "status": {"phase": "Succeeded"}}) for p in kube.created]
    kube.deleted.clear()
    for _ in range(3):
        with pytest.raises(kopf.TemporaryError):
            controller.finalize(BODY, done)
    assert kube.deleted == [done[0].name]
    assert [(n, r) for n, r, _ in kube.posted] == [("a", "ModuleUnloaded")]
