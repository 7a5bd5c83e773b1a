"""A rollout wave in one pass: the ready label goes, and the gated pods are read and the
module replaced at once, rather than a pass later, once the watch shows the label gone; the
node's Event follows.

The Kube is the recording stand-in of test_module_builds (no API server).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from kmodkit.core.engine.loader_pod import LoaderPod, loader_pod_view
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime import module_controller
from kmodkit.core.runtime.module_controller import ModuleController
from tests.unit.core.runtime.test_module_builds import KERNEL, RecordingKube, _controller
from tests.unit.core.runtime.test_module_slices import READY, _gated, _module

NEXT = f"r.io/xe-next:{KERNEL}"


def _next_module() -> dict[str, Any]:
    body = _module()
    (mapping,) = body["spec"]["moduleLoader"]["container"]["kernelMappings"]
    mapping["containerImage"] = "r.io/xe-next:${KERNEL_FULL_VERSION}"
    return body


def _serving(kube: RecordingKube, controller: ModuleController) -> LoaderPod:
    """n1 runs the first module, ready and labelled so; the next one's image exists."""
    controller.reconcile(_module(), [], [])
    (made,) = kube.created
    controller.shared.nodes["n1"] = NodeView("n1", {READY: ""}, KERNEL, "amd64", True)
    controller.answers.put((NEXT, ""), Answer(Existence.EXISTS))
    kube.calls.clear()
    kube.created.clear()
    return replace(loader_pod_view(made), ready=True)


def _kube(gated: dict[str, list[dict[str, Any]]]) -> RecordingKube:
    kube = RecordingKube()
    kube.pods_on_node = lambda node: (  # type: ignore[attr-defined]
        kube.calls.append(("pods_on_node", node)) or gated.get(node, [])
    )
    kube.delete_pod = lambda _ns, name: kube.calls.append(("delete_pod", name))  # type: ignore[attr-defined]
    return kube


def test_an_update_unlabels_reads_the_gated_pods_and_replaces_the_module_in_one_pass() -> None:
    kube = _kube({})
    controller = _controller(kube, Existence.EXISTS)
    old = _serving(kube, controller)
    controller.reconcile(_next_module(), [old], [])
    # The node's Event comes after the pod writes, which wait for no Event.
    writes = [c[0] if c[0] != "event" else c for c in kube.calls]
    assert writes == [
        "label_node",
        "pods_on_node",
        "create",
        "delete_pod",
        ("event", "ModuleNotReady"),
    ]
    (new,) = kube.created
    assert new["spec"]["nodeName"] == "n1"
    assert new["spec"]["initContainers"][0]["image"] == NEXT
    assert ("delete_pod", old.name) in kube.calls


def test_a_gated_pod_holds_the_replacement_once_the_label_is_gone() -> None:
    kube = _kube({"n1": [_gated("plugin", "n1")]})
    controller = _controller(kube, Existence.EXISTS)
    old = _serving(kube, controller)
    requeue = controller.reconcile(_next_module(), [old], [])
    assert [c[0] for c in kube.calls if c[0] != "event"] == ["label_node", "pods_on_node"]
    assert requeue == module_controller.CONSUMER_RECHECK_SECONDS


def test_a_refused_unlabel_replaces_nothing() -> None:
    kube = _kube({})
    controller = _controller(kube, Existence.EXISTS)
    old = _serving(kube, controller)

    def refuse(node: str, change: Any) -> None:
        kube.calls.append(("label_node", node))
        raise ApiException(status=403, reason="Forbidden")

    kube.label_node = refuse  # type: ignore[method-assign]
    controller.reconcile(_next_module(), [old], [])
    assert [c[0] for c in kube.calls if c[0] != "event"] == ["label_node"]
    assert kube.created == []
