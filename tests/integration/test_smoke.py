"""The plumbing every other test stands on, proven against the real control plane."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import running_operator
from kmodkit_dev.waiting import wait_until


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def test_crd_with_cel_rule_rejects_with_its_message(kube_api: Any, namespace: str) -> None:
    group = f"smoke{_uid()}.kmodkit.io"
    ext = client.ApiextensionsV1Api(kube_api)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"replicas": {"type": "integer"}},
                                    "x-kubernetes-validations": [
                                        {
                                            "rule": "self.replicas <= 3",
                                            "message": "spec.replicas must be at most 3",
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(crd)
    try:
        wait_until(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in (
                    ext.read_custom_resource_definition(f"widgets.{group}").status.conditions or []
                )
            ),
            "the CRD to be established",
        )
        co = client.CustomObjectsApi(kube_api)

        def make(replicas: int) -> dict[str, Any]:
            return {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": f"w{replicas}"},
                "spec": {"replicas": replicas},
            }

        # A freshly established CRD can take a moment to be served.
        wait_until(lambda: _try_create(co, group, namespace, make(2)), "the CR to be created")
        with pytest.raises(ApiException) as err:
            co.create_namespaced_custom_object(group, "v1", namespace, "widgets", make(5))
        assert err.value.status == 422
        assert "spec.replicas must be at most 3" in err.value.body
    finally:
        ext.delete_custom_resource_definition(f"widgets.{group}")


def _try_create(co: client.CustomObjectsApi, group: str, ns: str, body: dict[str, Any]) -> bool:
    try:
        co.create_namespaced_custom_object(group, "v1", ns, "widgets", body)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


@pytest.fixture
def kwok_node(dev_cluster: devcluster.Cluster) -> Any:
    name = f"smoke-{_uid()}"
    devcluster.add_nodes(dev_cluster, [node_manifest(name, "6.8.0-45-generic", {"smoke": name})])
    yield name
    client.CoreV1Api(devcluster.api_client(dev_cluster)).delete_node(name)


def test_node_label_patch_and_cordon(kube_api: Any, kwok_node: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.patch_node(kwok_node, {"metadata": {"labels": {"kmm.node.kubernetes.io/x.y.ready": ""}}})
    core.patch_node(kwok_node, {"spec": {"unschedulable": True}})
    node = core.read_node(kwok_node)
    assert node.metadata.labels["kmm.node.kubernetes.io/x.y.ready"] == ""
    assert node.spec.unschedulable is True
    assert node.status.node_info.kernel_version == "6.8.0-45-generic"
    # The controller-manager taints a cordoned node; kwok keeps it Ready.
    wait_until(
        lambda: any(
            t.key == "node.kubernetes.io/unschedulable"
            for t in (core.read_node(kwok_node).spec.taints or [])
        ),
        "the unschedulable taint",
    )


def _pod(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]},
    }


def _ready_after(core: Any, namespace: str, name: str) -> float | None:
    """Seconds from the pod's creation until it turned Ready (None: not Ready)."""
    pod = core.read_namespaced_pod(name, namespace)
    ready = [c for c in pod.status.conditions or [] if c.type == "Ready" and c.status == "True"]
    if not ready:
        return None
    return float((ready[0].last_transition_time - pod.metadata.creation_timestamp).total_seconds())


def test_a_pod_that_asks_to_turn_ready_late_does(
    kube_api: Any, namespace: str, kwok_node: str
) -> None:
    """kwok's pod-ready stage waits as long as a pod's toleration of
    kmodkit.io/simulate-ready-after says (the chaos harness's slow loads)."""
    core = client.CoreV1Api(kube_api)
    late = _pod("late", kwok_node, {})
    late["spec"]["tolerations"] = [
        {
            "key": "kmodkit.io/simulate-ready-after",
            "operator": "Equal",
            "value": "4s",
            "effect": "NoSchedule",
        }
    ]
    core.create_namespaced_pod(namespace, late)
    core.create_namespaced_pod(namespace, _pod("quick", kwok_node, {}))
    wait_until(lambda: _ready_after(core, namespace, "quick") is not None, "the quick pod Ready")
    wait_until(lambda: _ready_after(core, namespace, "late") is not None, "the late pod Ready")
    assert (_ready_after(core, namespace, "quick") or 0) <= 1
    # Both times are whole seconds: 4 s after creation is at least 3 s by them.
    assert (_ready_after(core, namespace, "late") or 0) >= 3


def test_a_pod_whose_readiness_the_test_plays_runs_unready_until_set_ready(
    kube_api: Any, namespace: str, kwok_node: str
) -> None:
    """A pod whose first container has KMODKIT_SIMULATE_READY=probe runs, not Ready, until
    the test sets it Ready (the Tenstorrent builders' stand-in plays their probe), and
    stays as set."""
    core = client.CoreV1Api(kube_api)
    probed = _pod("probed", kwok_node, {})
    probed["spec"]["containers"][0]["env"] = [
        {"name": "OTHER", "value": "probe"},
        {"name": "KMODKIT_SIMULATE_READY", "value": "probe"},
    ]
    core.create_namespaced_pod(namespace, probed)
    wait_until(
        lambda: core.read_namespaced_pod("probed", namespace).status.phase == "Running",
        "the probed pod Running",
    )
    time.sleep(3)  # longer than kwok takes to make a pod Ready
    pod = core.read_namespaced_pod("probed", namespace)
    assert pod.status.phase == "Running" and _ready_after(core, namespace, "probed") is None
    assert [c.started for c in pod.status.container_statuses] == [True]
    ready = {"type": "Ready", "status": "True"}
    core.patch_namespaced_pod_status("probed", namespace, {"status": {"conditions": [ready]}})
    time.sleep(2)
    assert _ready_after(core, namespace, "probed") is not None
    assert core.read_namespaced_pod("probed", namespace).status.phase == "Running"


def test_eviction_honours_pod_disruption_budget(
    kube_api: Any, namespace: str, kwok_node: str
) -> None:
    core = client.CoreV1Api(kube_api)
    policy = client.PolicyV1Api(kube_api)
    for n in ("a", "b"):
        core.create_namespaced_pod(namespace, _pod(n, kwok_node, {"app": "pdb"}))
    for n in ("a", "b"):
        wait_until(
            lambda n=n: core.read_namespaced_pod(n, namespace).status.phase == "Running",
            f"pod {n} to run",
        )
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pdb"}}},
        },
    )
    wait_until(
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "pdb", namespace
            ).status.disruptions_allowed
            == 1
        ),
        "the PDB to allow one disruption",
    )

    def evict(name: str) -> None:
        core.create_namespaced_pod_eviction(
            name,
            namespace,
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
        )

    evict("a")
    wait_until(
        lambda: "a" not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items},
        "the evicted pod to be gone",
    )
    with pytest.raises(ApiException) as err:
        evict("b")
    assert err.value.status == 429  # the budget refuses the second disruption
    assert core.read_namespaced_pod("b", namespace).metadata.deletion_timestamp is None


def test_owner_reference_garbage_collects_child(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    parent = core.create_namespaced_config_map(namespace, {"metadata": {"name": "parent"}})
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "parent",
                        "uid": parent.metadata.uid,
                        "controller": True,
                    }
                ],
            }
        },
    )
    core.delete_namespaced_config_map("parent", namespace)

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
            return False
        except ApiException as e:
            return e.status == 404

    wait_until(child_gone, "the controller-manager to collect the child")


def test_daemonset_gets_one_ready_pod_per_matching_node(
    kube_api: Any, namespace: str, dev_cluster: devcluster.Cluster
) -> None:
    tag = _uid()
    names = [f"ds-{tag}-{i}" for i in range(3)]
    devcluster.add_nodes(
        dev_cluster, [node_manifest(n, "7.0.0-14-generic", {"ds-smoke": tag}) for n in names]
    )
    core = client.CoreV1Api(kube_api)
    try:
        apps = client.AppsV1Api(kube_api)
        apps.create_namespaced_daemon_set(
            namespace,
            {
                "metadata": {"name": "agent"},
                "spec": {
                    "selector": {"matchLabels": {"app": "agent"}},
                    "template": {
                        "metadata": {"labels": {"app": "agent"}},
                        "spec": {
                            "nodeSelector": {"ds-smoke": tag},
                            "containers": [{"name": "c", "image": "busybox:1.36"}],
                        },
                    },
                },
            },
        )
        wait_until(
            lambda: apps.read_namespaced_daemon_set("agent", namespace).status.number_ready == 3,
            "3 ready daemon pods",
        )
        pods = core.list_namespaced_pod(namespace, label_selector="app=agent").items
        assert sorted(p.spec.node_name for p in pods) == sorted(names)
    finally:
        for n in names:
            core.delete_node(n)


def test_job_completes_and_a_simulated_failure_fails(kube_api: Any, namespace: str) -> None:
    batch = client.BatchV1Api(kube_api)

    def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"type": "kwok"},
                        "containers": [{"name": "c", "image": "busybox:1.36"}],
                    },
                },
            },
        }

    batch.create_namespaced_job(namespace, job("ok", {}))
    batch.create_namespaced_job(namespace, job("bad", {"kmodkit.io/simulate": "fail"}))

    def finished(name: str, kind: str) -> bool:
        conds = batch.read_namespaced_job(name, namespace).status.conditions or []
        return any(c.type == kind and c.status == "True" for c in conds)

    wait_until(lambda: finished("ok", "Complete"), "job ok to complete")
    wait_until(lambda: finished("bad", "Failed"), "job bad to fail")


def test_operator_runtime_starts_loads_backends_and_stops_cleanly(
    kubeconfig: str, tmp_path: Path
) -> None:
    with running_operator(kubeconfig, tmp_path / "operator.log") as op:
        body = op.health()
        assert body is not None
        assert body["backends"] == {"intel_xe": "running", "tenstorrent": "running"}
        assert op.stop() == 0
