"""The caches keep a fleet's repeated strings once: each node and pod arrives as its own
decoded answer, with its own copy of every label key, value and hash."""

from __future__ import annotations

import json
from typing import Any

from kmodkit.core.engine.loader_pod import loader_pod_view
from kmodkit.core.nodes import node_view, slim_node
from kmodkit.core.runtime.informer_cache import kept_whole
from kmodkit_dev.nodes import node_manifest


def _decoded(obj: dict[str, Any]) -> dict[str, Any]:
    """As the informer gets it: one answer, decoded alone."""
    return dict(json.loads(json.dumps(obj)))


def _node(name: str) -> dict[str, Any]:
    manifest = node_manifest(name, "6.8.0-45-generic", {"feature.node.kubernetes.io/x": "true"})
    manifest["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "kwok"}]
    return _decoded(manifest)


def test_two_nodes_share_their_label_keys_values_and_node_info() -> None:
    a, b = slim_node(_node("node-a")), slim_node(_node("node-b"))
    key = "feature.node.kubernetes.io/x"
    (a_key,) = [k for k in a["metadata"]["labels"] if k == key]
    (b_key,) = [k for k in b["metadata"]["labels"] if k == key]
    assert a_key is b_key
    assert a["metadata"]["labels"][key] is b["metadata"]["labels"][key]
    kwok = "kwok.x-k8s.io/node"
    assert a["metadata"]["annotations"][kwok] is b["metadata"]["annotations"][kwok]
    info_a, info_b = a["status"]["nodeInfo"], b["status"]["nodeInfo"]
    assert info_a["kernelVersion"] is info_b["kernelVersion"]
    assert a["status"]["conditions"][0]["status"] is b["status"]["conditions"][0]["status"]
    # The views made from the cache's nodes share them too, and read the same.
    va, vb = node_view(a), node_view(b)
    assert va.labels[key] is vb.labels[key] and va.kernel is vb.kernel
    assert va.ready and va.kernel == "6.8.0-45-generic"
    assert va == node_view(_node("node-a"))


def _pod(name: str, node: str) -> dict[str, Any]:
    return _decoded(
        {
            "metadata": {
                "name": name,
                "annotations": {
                    "kmodkit.io/config-hash": "c" * 32,
                    "kmodkit.io/module-hash": "m" * 32,
                    "kmodkit.io/kernel": "6.8.0-45-generic",
                    "kmodkit.io/agent-config": "modprobe:\n  moduleName: bench\n",
                },
            },
            "spec": {
                "nodeName": node,
                "initContainers": [{"name": "image-extractor", "image": "reg/kmod:6.8.0"}],
            },
            "status": {"phase": "Running"},
        }
    )


def test_two_loader_pods_share_what_their_module_gives_them() -> None:
    a, b = loader_pod_view(_pod("a", "node-a")), loader_pod_view(_pod("b", "node-b"))
    for field in ("config_hash", "module_hash", "kernel", "agent_config", "image", "phase"):
        assert getattr(a, field) is getattr(b, field), field
        assert getattr(a, field), field


def _builder_pod(name: str, node: str) -> dict[str, Any]:
    return _decoded(
        {
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/name": "tt-builder"},
                "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {}}],
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "builder", "image": "reg/tt-builder:2.9.0"}],
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )


def test_watched_objects_are_kept_whole_less_managed_fields_sharing_strings() -> None:
    a, b = kept_whole(_builder_pod("a", "node-a")), kept_whole(_builder_pod("b", "node-b"))
    expected = _builder_pod("a", "node-a")
    del expected["metadata"]["managedFields"]
    assert a == expected
    image = "reg/tt-builder:2.9.0"
    assert a["spec"]["containers"][0]["image"] is b["spec"]["containers"][0]["image"] == image
    (a_key,) = [k for k in a["spec"]["containers"][0] if k == "image"]
    (b_key,) = [k for k in b["spec"]["containers"][0] if k == "image"]
    assert a_key is b_key
    assert a["status"]["conditions"][0]["type"] is b["status"]["conditions"][0]["type"]
