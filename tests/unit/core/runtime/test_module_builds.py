"""A Module pass posts build events and records them on the build Job, in that order; it
plans with the states of the images it needs.

The Kube here is a stand-in that records the calls the controller makes (no API
server); the registry's answer is put in the controller's cache, so no registry
is asked. What to post is planned in kmodkit.core.engine.build_plan (tested
there); these tests pin the wiring: post first, record after, read the
Dockerfile only when a build needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kmodkit.core.engine.build_plan import (
    REPORTED_ANNOTATION,
    BuildSettings,
    build_job_view,
)
from kmodkit.core.engine.loader_plan import plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime import module_controller
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import WritePool

NS, NAME, KERNEL = "drivers", "xe", "7.0.0-14-generic"
IMAGE = f"r.io/xe:{KERNEL}"


class RecordingKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: records what a pass does, in order."""

    def __init__(self) -> None:
        # One write at a time, as recorded: the order the pass hands them over.
        self.writes = WritePool(1, api_message)
        self.calls: list[tuple[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.refused: set[str] = set()
        self.events = self  # posts through ``post`` below, as Kube does through its Recorder

    def post(self, involved: Mapping[str, Any], reason: str, message: str, **_: Any) -> bool:
        self.calls.append(("event", reason))
        return reason not in self.refused

    def create(self, obj: Mapping[str, Any]) -> None:
        self.created.append(dict(obj))
        self.calls.append(("create", obj["metadata"]["name"]))

    def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append(("delete_job", name))

    def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.calls.append(("annotate_job", (name, dict(annotations))))

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(("read_config_map", name))
        return {"dockerfile": "FROM scratch\n"}

    def label_node(self, node: str, change: Mapping[str, str | None]) -> None:
        self.calls.append(("label_node", node))

    def write_status(self, *args: Any) -> None:
        pass


def _module() -> dict[str, Any]:
    mapping = {
        "regexp": ".*",
        "containerImage": "r.io/xe:${KERNEL_FULL_VERSION}",
        "build": {"dockerfileConfigMap": {"name": "df"}},
    }
    return {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": NAME, "namespace": NS, "uid": "u1", "generation": 1},
        "spec": {
            "selector": {},
            "moduleLoader": {
                "container": {"modprobe": {"moduleName": "xe"}, "kernelMappings": [mapping]}
            },
        },
    }


def _controller(kube: RecordingKube, existence: Existence) -> ModuleController:
    shared = Shared(kube=kube, operator_namespace="kmodkit-system", nodes_synced=True)  # type: ignore[arg-type]
    shared.nodes["n1"] = NodeView("n1", {}, KERNEL, "amd64", True)
    settings = ModuleControllerSettings(
        loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
        build=BuildSettings(builder_image="registry.example.com/builder:1"),
    )
    controller = ModuleController(shared, settings)
    controller.answers.put((IMAGE, ""), Answer(existence))
    return controller


def _calls(kube: RecordingKube, *kinds: str) -> list[tuple[str, Any]]:
    return [c for c in kube.calls if c[0] in kinds]


def test_build_events_are_posted_before_the_job_records_them() -> None:
    kube = RecordingKube()
    controller = _controller(kube, Existence.MISSING)
    controller.reconcile(_module(), [], [])
    (job,) = kube.created
    assert _calls(kube, "create", "event", "read_config_map") == [
        ("read_config_map", "df"),
        ("create", job["metadata"]["name"]),
        ("event", "BuildCreated"),
    ]
    kube.calls.clear()
    running = build_job_view({**job, "status": {"active": 1}})
    controller.reconcile(_module(), [], [running])
    assert _calls(kube, "event", "annotate_job") == [
        ("event", "BuildStarted"),
        ("annotate_job", (job["metadata"]["name"], {REPORTED_ANNOTATION: "started"})),
    ]
    kube.calls.clear()
    meta = {
        **job["metadata"],
        "annotations": {**job["metadata"]["annotations"], REPORTED_ANNOTATION: "started"},
    }
    told = build_job_view({**job, "metadata": meta, "status": {"active": 1}})
    controller.reconcile(_module(), [], [told])
    assert _calls(kube, "event", "annotate_job", "create", "delete_job") == []


def test_a_module_whose_images_exist_reads_no_dockerfile() -> None:
    kube = RecordingKube()
    _controller(kube, Existence.EXISTS).reconcile(_module(), [], [])
    assert _calls(kube, "read_config_map", "event") == []
    assert [o["kind"] for o in kube.created] == ["Pod"]


def test_a_refused_event_is_not_recorded_so_the_next_pass_posts_it_again() -> None:
    kube = RecordingKube()
    controller = _controller(kube, Existence.MISSING)
    controller.reconcile(_module(), [], [])
    (job,) = kube.created
    kube.calls.clear()
    kube.refused.add("BuildStarted")
    controller.reconcile(_module(), [], [build_job_view({**job, "status": {"active": 1}})])
    assert _calls(kube, "event", "annotate_job") == [("event", "BuildStarted")]


def test_a_pass_plans_the_fleet_once_when_it_needs_the_images_the_last_one_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        plans.append(1)
        return plan(*args, **kwargs)

    monkeypatch.setattr(module_controller, "plan", counted)
    controller = _controller(RecordingKube(), Existence.EXISTS)
    controller.reconcile(_module(), [], [])
    assert len(plans) == 2  # the first pass learns which images it needs
    plans.clear()
    controller.reconcile(_module(), [], [])
    assert len(plans) == 1


def test_a_changed_image_is_planned_with_its_own_state_in_the_same_pass() -> None:
    kube = RecordingKube()
    controller = _controller(kube, Existence.EXISTS)
    controller.reconcile(_module(), [], [])
    kube.created.clear()
    body = _module()
    (mapping,) = body["spec"]["moduleLoader"]["container"]["kernelMappings"]
    mapping["containerImage"] = "r.io/xe2:${KERNEL_FULL_VERSION}"
    controller.answers.put((f"r.io/xe2:{KERNEL}", ""), Answer(Existence.EXISTS))
    # On a node of its own: n1's pod is a create the caches have not shown yet.
    del controller.shared.nodes["n1"]
    controller.shared.nodes["n2"] = NodeView("n2", {}, KERNEL, "amd64", True)
    controller.reconcile(body, [], [])
    (pod,) = kube.created
    assert pod["spec"]["initContainers"][0]["image"] == f"r.io/xe2:{KERNEL}"


def test_a_node_able_to_build_since_the_last_pass_gets_its_build_in_this_one() -> None:
    kube = RecordingKube()
    controller = _controller(kube, Existence.MISSING)
    controller.shared.nodes["n1"] = NodeView("n1", {}, KERNEL, "amd64", False)
    controller.reconcile(_module(), [], [])
    assert kube.created == []  # no ready node runs the kernel to build on
    controller.shared.nodes["n1"] = NodeView("n1", {}, KERNEL, "amd64", True)
    controller.reconcile(_module(), [], [])
    assert [o["kind"] for o in kube.created] == ["Job"]
