"""The apiserver semantics the swap's guard relies on, on a real control plane.

A swap step writes its marker guarded by the observed resourceVersion and calls
the swap hook only if that write lands (``kmodkit/core/rollout/reconcile.py``,
``write_step``). After a kill the marker is already on the node, so the write
changes nothing: it must still be refused when the view is stale, and when it
lands it must return the resourceVersion the state write is then guarded by.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit.core.rollout import apply
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.plan import NodePatch

pytestmark = pytest.mark.cluster

KEYS = RolloutKeys.for_policy("guard.test")
MARKER = NodePatch(annotations={KEYS.swap: "v2"})


@pytest.fixture
def node(kube_api: Any) -> Iterator[str]:
    core = client.CoreV1Api(kube_api)
    name = f"guard-{uuid.uuid4().hex[:8]}"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    core.delete_node(name)


def _resource_version(core: client.CoreV1Api, name: str) -> str:
    return str(core.read_node(name).metadata.resource_version)


def test_a_marker_write_proves_the_view_even_when_it_changes_nothing(
    kube_api: Any, node: str
) -> None:
    core = client.CoreV1Api(kube_api)
    # The controller-manager touches a new node several times (taints, lifecycle):
    # a write it overtakes is refused, rightly; read again and retry.
    for _ in range(20):
        observed = _resource_version(core, node)
        written = apply.patch_node(core, node, apply.patch_body(MARKER, observed))
        if written is not None:
            break
        time.sleep(0.1)
    assert written and written != observed, "a marker write that changes the node is stored"

    # The marker is there now: writing it again, from a view older than the node, is refused.
    assert apply.patch_node(core, node, apply.patch_body(MARKER, observed)) is None

    # From a current view the same write lands without being stored, and returns the
    # resourceVersion the view was at (the one the state write is guarded by next).
    for _ in range(20):  # another component may change the node between the read and the write
        current = _resource_version(core, node)
        again = apply.patch_node(core, node, apply.patch_body(MARKER, current))
        if again is not None:
            break
        time.sleep(0.1)
    assert again == current, "an unchanged marker write must not bump the resourceVersion"
