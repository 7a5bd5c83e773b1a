"""Deleting a Module unloads only nodes whose readiness labels it has taken away.

The Kube here is a stand-in that records the calls the controller makes (no API
server): these tests pin the controller's decision of what to unlabel and
delete on a node cache that is still filling, not the API's behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
import pytest

from kmodkit.core import labels
from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit.core.engine.loader_pod import LoaderPod, LoaderSettings
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.watch_cache import Shared

NS, NAME, KERNEL = "drivers", "xe", "6.8.0-45-generic"
READY = labels.READY.key(NS, NAME)


class RecordingKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: records label and delete calls."""

    def __init__(self) -> None:
        self.labelled: list[tuple[str, dict[str, str | None]]] = []
        self.deleted: list[str] = []

    def label_node(self, node: str, change: Mapping[str, str | None]) -> None:
        self.labelled.append((node, dict(change)))

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return []

    def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append(name)


def _controller(kube: RecordingKube, seen: list[str]) -> ModuleController:
    shared = Shared(kube=kube, operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    for name in seen:
        shared.nodes[name] = NodeView(name, {READY: ""}, KERNEL)
    settings = ModuleControllerSettings(
        loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
        build=BuildSettings(builder_image="registry.example.com/builder:1"),
    )
    return ModuleController(shared, settings)


def _pod(node: str) -> LoaderPod:
    return LoaderPod(f"{NAME}-loader-{node}", node, "hash", KERNEL, "", ready=True)


def test_a_pod_on_a_node_not_seen_yet_is_kept_until_the_node_is_seen() -> None:
    kube = RecordingKube()
    controller = _controller(kube, seen=["a"])
    with pytest.raises(kopf.TemporaryError, match=r"b \(node not seen yet\)"):
        controller.finalize(NS, NAME, [_pod("a"), _pod("b")])
    assert kube.labelled == [("a", {READY: None})]
    assert kube.deleted == [f"{NAME}-loader-a"]


def test_once_every_node_is_seen_every_pod_is_unloaded() -> None:
    kube = RecordingKube()
    controller = _controller(kube, seen=["a", "b"])
    with pytest.raises(kopf.TemporaryError, match="waiting for 2 loader pods"):
        controller.finalize(NS, NAME, [_pod("a"), _pod("b")])
    assert sorted(kube.deleted) == [f"{NAME}-loader-a", f"{NAME}-loader-b"]
