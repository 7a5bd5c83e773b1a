"""A pass that starts before the watch delivered the last pass's writes does not send them again.

The Kube here is a stand-in that records the writes the controller sends (no API
server); the tests play the watch by changing the caches the controller reads, and the
clock is a variable, so nothing here waits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit.core.engine.loader_plan import LoaderPlan
from kmodkit.core.engine.loader_pod import LoaderPod, LoaderSettings
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.unseen_writes import PATIENCE_SECONDS, UnseenWrites
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import WritePool

NS, NAME = "drivers", "xe"
READY = f"kmm.node.kubernetes.io/{NS}.{NAME}.ready"
BODY = {"metadata": {"namespace": NS, "name": NAME}}


class RecordingKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: records creates and label writes."""

    def __init__(self) -> None:
        self.writes = WritePool(1, api_message)
        self.sent: list[tuple[str, str]] = []

    def create(self, obj: dict[str, Any]) -> None:
        self.sent.append(("create", obj["metadata"]["name"]))

    def label_node(self, node: str, change: dict[str, str | None]) -> None:
        self.sent.append(("label", node))

    @property
    def events(self) -> RecordingKube:
        return self

    def post(self, *args: Any, **kwargs: Any) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _controller(kube: RecordingKube) -> ModuleController:
    shared = Shared(kube=kube, operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    shared.nodes["n1"] = NodeView("n1", {}, "6.8.0")
    return ModuleController(
        shared,
        ModuleControllerSettings(
            loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
            build=BuildSettings(builder_image="registry.example.com/builder:1"),
        ),
    )


def _pass(controller: ModuleController, pods: list[LoaderPod], clock: Clock) -> None:
    """What a pass that plans a loader pod and the ready label for n1 sends."""
    unseen = controller._unseen(NS, NAME, pods)
    unseen.clock = clock
    final = LoaderPlan(create=[{"metadata": {"name": "xe-n1"}, "spec": {"nodeName": "n1"}}])
    if not any(p.name == "xe-n1" for p in pods):
        controller._apply_pods(final, {"kind": "Module"}, NS, unseen)
    if READY not in controller.nodes["n1"].labels:
        controller._label_nodes({"n1": {READY: ""}}, BODY, unseen)


def test_writes_the_caches_do_not_show_yet_are_sent_once() -> None:
    kube, clock = RecordingKube(), Clock()
    controller = _controller(kube)
    _pass(controller, [], clock)
    _pass(controller, [], clock)  # the watch has delivered nothing yet
    assert kube.sent == [("create", "xe-n1"), ("label", "n1")]


def test_once_seen_a_write_is_forgotten_and_sent_again_if_undone() -> None:
    kube, clock = RecordingKube(), Clock()
    controller = _controller(kube)
    _pass(controller, [], clock)
    # The watch delivers both writes, then the pod is deleted and the label removed
    # (by someone else): the caches look as before the first pass.
    pod = LoaderPod("xe-n1", "n1", "h", "6.8.0", "", ready=True)
    node = controller.nodes["n1"]
    controller.nodes["n1"] = replace(node, labels={READY: ""})
    _pass(controller, [pod], clock)
    controller.nodes["n1"] = node
    _pass(controller, [], clock)
    assert kube.sent == [("create", "xe-n1"), ("label", "n1")] * 2


def test_a_write_never_seen_is_sent_again_after_the_patience() -> None:
    kube, clock = RecordingKube(), Clock()
    controller = _controller(kube)
    _pass(controller, [], clock)
    assert controller.unseen[(NS, NAME)].next_due() == PATIENCE_SECONDS
    clock.now = PATIENCE_SECONDS
    _pass(controller, [], clock)
    assert kube.sent == [("create", "xe-n1"), ("label", "n1")] * 2


def test_a_refused_write_is_not_remembered() -> None:
    unseen = UnseenWrites(clock=Clock())
    kube = RecordingKube()

    def refuse(obj: dict[str, Any]) -> None:
        raise ApiException(status=403, reason="Forbidden")

    kube.create = refuse  # type: ignore[method-assign]
    controller = _controller(kube)
    final = LoaderPlan(create=[{"metadata": {"name": "xe-n1"}, "spec": {"nodeName": "n1"}}])
    assert controller._apply_pods(final, {"kind": "Module"}, NS, unseen)[0]
    assert unseen.next_due() is None
