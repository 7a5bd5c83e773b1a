"""Two Tenstorrent driver policies over one node, on a real control plane with the real
operator: the node runs one builder, the older policy's; the younger reports NodeConflict
naming the older and runs its builder only on its own node; deleting the older hands the node
to the younger (its rollout reloads tt-kmd) only once the older's builder pod, kept terminating
by a finalizer, is gone: at no instant do two builders share the node.
With the operator stopped, relabelling a node onto the older policy moves its builder there
and the younger's off: the DaemonSets' affinities alone keep them apart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.operator import running_operator
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    BUILDER_SELECTOR,
    DRIVER,
    FakeBuilder,
    Poller,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    label_node,
    node_labels,
    operator_env,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

POLICY_LABEL = "driver.tenstorrent.com/cr"
KMD = "driver.tenstorrent.com/kmd-version"
LINGER = "kmodkit.io/test-linger"


def _builders(core: Any, namespace: str) -> dict[str, list[str]]:
    """Every builder pod on each node (terminating ones too), by the policy it belongs to."""
    found: dict[str, list[str]] = {}
    for pod in core.list_namespaced_pod(namespace, label_selector=BUILDER_SELECTOR).items:
        if pod.spec.node_name:
            found.setdefault(pod.spec.node_name, []).append(pod.metadata.labels[POLICY_LABEL])
    return found


class Sharing:
    """Independent of the operator: every moment two builder pods were on one node."""

    def __init__(self, core: Any, namespace: str, nodes: list[str]) -> None:
        self.core, self.namespace, self.nodes = core, namespace, nodes
        self.shared: list[tuple[str, list[str]]] = []
        self.poller = Poller(self._tick, 0.1)

    def _tick(self) -> None:
        for node, policies in _builders(self.core, self.namespace).items():
            if node in self.nodes and len(policies) > 1:
                self.shared.append((node, sorted(policies)))


def _entry(kube_api: Any, policy: str, node: str) -> dict[str, Any]:
    return next(
        (n for n in status(kube_api, DRIVER, policy).get("nodes", []) if n["name"] == node), {}
    )


def _state(kube_api: Any, policy: str, node: str) -> tuple[str, str]:
    entry = _entry(kube_api, policy, node)
    return (entry.get("state", ""), entry.get("reason", ""))


@pytest.fixture
def env(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path: Any
) -> Iterator[tuple[Any, str, str]]:
    tag = uuid.uuid4().hex[:6]
    with tt_operator(kubeconfig, kube_api, tmp_path, builders_played=True) as (op, namespace):
        builder = FakeBuilder(kube_api, namespace)
        try:
            yield op, namespace, tag
        finally:
            builder.stop()
            for name in (f"ovo-{tag}", f"ovy-{tag}"):
                delete_policy(kube_api, DRIVER, name)
            delete_nodes(kube_api, [f"tto-{tag}-shared", f"tto-{tag}-own"])
        assert not builder.poller.errors, builder.poller.errors


def test_two_driver_policies_over_one_node_run_one_builder_the_older_ones(
    dev_cluster: Any, kube_api: Any, env: tuple[Any, str, str]
) -> None:
    _, namespace, tag = env
    core = client.CoreV1Api(kube_api)
    shared, own = f"tto-{tag}-shared", f"tto-{tag}-own"
    older, younger = f"ovo-{tag}", f"ovy-{tag}"
    add_fleet(dev_cluster, kube_api, [shared], {"tto-test": tag, "tto-old": tag, "tto-young": tag})
    add_fleet(dev_cluster, kube_api, [own], {"tto-test": tag, "tto-young": tag})
    sharing = Sharing(core, namespace, [shared, own])
    try:
        create_policy(
            kube_api, DRIVER, demo_objects.driver_policy(older, "2.8.0", {"tto-old": tag})
        )
        wait_until(
            lambda: _state(kube_api, older, shared) == ("Done", "Ready"),
            "the older policy's builder loaded tt-kmd on the shared node",
            timeout=120,
        )
        time.sleep(1.1)  # creationTimestamp has a resolution of one second
        create_policy(
            kube_api, DRIVER, demo_objects.driver_policy(younger, "2.9.0", {"tto-young": tag})
        )
        wait_until(
            lambda: _state(kube_api, younger, own) == ("Done", "Ready"),
            "the younger policy's builder loaded tt-kmd on its own node",
            timeout=120,
        )
        time.sleep(3)  # the DaemonSet controller has placed the younger's builders by now
        assert _builders(core, namespace).get(shared) == [older]
        assert not sharing.shared, f"two builders on one node: {sharing.shared[:3]}"
        wait_until(
            lambda: _state(kube_api, younger, shared) == ("Conflict", "NodeConflict"),
            "the younger policy reports the shared node in conflict",
        )
        assert older in _entry(kube_api, younger, shared)["message"]
        assert status(kube_api, DRIVER, younger)["summary"]["conflicts"] == 1
        conflict_events = wait_until(
            lambda: [
                e
                for e in core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={shared}"
                ).items
                if e.reason == "NodeConflict"
            ],
            "a NodeConflict Event on the shared node",
        )
        assert conflict_events[0].type == "Warning" and older in conflict_events[0].message
        # Passes go on (the younger rolls nothing there): still one builder, the older's.
        time.sleep(8)
        assert _builders(core, namespace).get(shared) == [older]
        assert node_labels(kube_api, shared)[KMD] == "2.8.0"
        assert not sharing.shared, f"two builders on one node: {sharing.shared[:3]}"

        # The older's builder lingers (terminating) after its policy is gone: the younger's
        # builder must wait for it.
        (old_pod,) = [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=BUILDER_SELECTOR).items
            if p.spec.node_name == shared
        ]
        core.patch_namespaced_pod(
            old_pod.metadata.name, namespace, {"metadata": {"finalizers": [LINGER]}}
        )
        delete_policy(kube_api, DRIVER, older)
        apps = client.AppsV1Api(kube_api)
        wait_until(
            lambda: (
                not apps.list_namespaced_daemon_set(
                    namespace, label_selector=f"{POLICY_LABEL}={older}"
                ).items
            ),
            "the older policy's DaemonSet collected",
        )
        time.sleep(5)  # the younger's passes have seen the older go by now
        assert _builders(core, namespace).get(shared) == [older]
        assert not sharing.shared, f"two builders on one node: {sharing.shared[:3]}"
        assert _state(kube_api, younger, shared) == ("Pending", "WaitingForHandover")
        assert old_pod.metadata.name in _entry(kube_api, younger, shared)["message"]
        core.patch_namespaced_pod(
            old_pod.metadata.name, namespace, {"metadata": {"finalizers": None}}
        )
        wait_until(
            lambda: _state(kube_api, younger, shared) == ("Done", "Ready"),
            "the younger policy took the shared node over and reloaded tt-kmd",
            timeout=240,
        )
        assert _builders(core, namespace).get(shared) == [younger]
        assert node_labels(kube_api, shared)[KMD] == "2.9.0"
        assert not sharing.shared, f"two builders on one node: {sharing.shared[:3]}"
    finally:
        sharing.poller.stop()
        for pod in core.list_namespaced_pod(namespace, label_selector=BUILDER_SELECTOR).items:
            if LINGER in (pod.metadata.finalizers or []):
                core.patch_namespaced_pod(
                    pod.metadata.name, namespace, {"metadata": {"finalizers": None}}
                )
        assert not sharing.poller.errors, sharing.poller.errors


def test_with_the_operator_stopped_a_relabelled_node_moves_to_its_older_policy(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path: Any, env: tuple[Any, str, str]
) -> None:
    """Ownership lives in the DaemonSets' affinities: the DaemonSet controller moves the node's
    builder from the younger policy to the older one as the node's labels change, with no
    operator running."""
    op, namespace, tag = env
    core = client.CoreV1Api(kube_api)
    node = f"tto-{tag}-own"
    older, younger = f"ovo-{tag}", f"ovy-{tag}"
    add_fleet(dev_cluster, kube_api, [node], {"tto-test": tag, "tto-young": tag})
    create_policy(kube_api, DRIVER, demo_objects.driver_policy(older, "2.8.0", {"tto-old": tag}))
    time.sleep(1.1)
    create_policy(
        kube_api, DRIVER, demo_objects.driver_policy(younger, "2.8.0", {"tto-young": tag})
    )
    wait_until(
        lambda: _builders(core, namespace).get(node) == [younger],
        "the younger policy's builder on the node",
    )
    apps = client.AppsV1Api(kube_api)
    wait_until(
        lambda: (
            apps.list_namespaced_daemon_set(
                namespace, label_selector=f"{POLICY_LABEL}={older}"
            ).items
        ),
        "the older policy's DaemonSet",
    )
    op.stop()
    try:
        label_node(kube_api, node, {"tto-old": tag})
        wait_until(
            lambda: _builders(core, namespace).get(node) == [older],
            "the older policy's builder replaced the younger's, with no operator running",
            timeout=60,
        )
    finally:
        # An operator again, so the policies' finalizers let them go.
        with running_operator(
            kubeconfig, tmp_path / "again.log", **operator_env(namespace, builders_played=True)
        ):
            for name in (older, younger):
                delete_policy(kube_api, DRIVER, name)
            wait_until(
                lambda: (
                    not [
                        p
                        for p in client.CustomObjectsApi(kube_api).list_cluster_custom_object(
                            *DRIVER
                        )["items"]
                        if p["metadata"]["name"] in (older, younger)
                    ]
                ),
                "both policies deleted",
            )
