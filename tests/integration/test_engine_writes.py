"""The engine's writes on the real control plane: bounded in flight, and throttled by APF.

200 kwok nodes, one Module selecting them all, its image pushed to the real registry.
The real operator runs with a ServiceAccount's token (so API Priority and Fairness can
tell its requests apart from the tests' own, which are exempt as system:masters) and
with its metrics served, where the write pool's high-water mark
(``kmodkit_api_writes_in_flight_max``) and the throttled requests
(``kmodkit_api_throttled_total``) are read.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import audit
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import Operator, launch_with_metrics, token_kubeconfig
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
KERNEL = "6.8.0-45-generic"
NODES = 200
IN_FLIGHT = 8

pytestmark = pytest.mark.cluster


@pytest.fixture
def fleet(dev_cluster: devcluster.Cluster) -> Iterator[str]:
    # A fleet of its own per test: one test's Module never meets the other's operator.
    tag = uuid.uuid4().hex[:6]
    names = [f"wr-{tag}-{i}" for i in range(NODES)]
    devcluster.add_nodes(
        dev_cluster, [node_manifest(n, KERNEL, {"writes-test": tag}) for n in names]
    )
    yield tag
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for n in names:
        core.delete_node(n)


def _operator(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    namespace: str,
    reg: Registry,
    tmp_path: Path,
    **env: str,
) -> tuple[Operator, str]:
    """The real operator as ServiceAccount ``operator`` of ``namespace`` (bound to
    cluster-admin: RBAC is not what is tested here), its metrics on a port of its own."""
    install(kube_api)
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "operator"}})
    client.RbacAuthorizationV1Api(kube_api).create_cluster_role_binding(
        {
            "metadata": {"name": f"{namespace}-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": namespace}],
        }
    )
    config = token_kubeconfig(
        dev_cluster.kubeconfig, namespace, "operator", kube_api, tmp_path / "operator.kubeconfig"
    )
    op = launch_with_metrics(
        config,
        tmp_path / "operator.log",
        KMODKIT_REGISTRY_CA=str(reg.ca),
        KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:test",
        **env,
    )
    op.wait_healthy()
    return op, f"system:serviceaccount:{namespace}:operator"


def _metric(op: Operator, name: str) -> float:
    text = op.metrics()
    values = [float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values)


def _converge(kube_api: Any, namespace: str, reg: Registry, tag: str) -> None:
    """Apply a Module over the fleet; wait until every node has its loader pod and label."""
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(namespace, reg.pull_secret("pull"))
    reg.push(f"{reg.host}/kmods/xe:{KERNEL}")
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Module",
            "metadata": {"name": "xe"},
            "spec": {
                "selector": {"writes-test": tag},
                "imageRepoSecret": {"name": "pull"},
                "moduleLoader": {
                    "container": {
                        "modprobe": {"moduleName": "xe"},
                        "kernelMappings": [
                            {
                                "literal": KERNEL,
                                "containerImage": f"{reg.host}/kmods/xe:${{KERNEL_FULL_VERSION}}",
                            }
                        ],
                    }
                },
            },
        },
    )
    ready = f"kmm.node.kubernetes.io/{namespace}.xe.ready"
    wait_until(
        lambda: len(core.list_node(label_selector=f"writes-test={tag},{ready}").items) == NODES,
        f"the ready label on all {NODES} nodes",
        timeout=240,
    )
    pods = core.list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/component=module-loader"
    ).items
    assert len(pods) == NODES


def _no_write_failed(kube_api: Any, namespace: str, op: Operator) -> None:
    events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    assert [e.message for e in events if e.reason == "ApplyFailed"] == []
    assert not re.search(
        r"(creating|deleting|labelling|annotating|applying) \S+ \S+ failed", op.logged()
    )


def test_a_pass_over_200_nodes_writes_in_parallel_within_the_bound(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: str,
    tmp_path: Path,
) -> None:
    op, user = _operator(
        dev_cluster,
        kube_api,
        namespace,
        oci_registry,
        tmp_path,
        KMODKIT_WRITE_CONCURRENCY=str(IN_FLIGHT),
        KMODKIT_WRITE_QPS="0",
    )
    try:
        _converge(kube_api, namespace, oci_registry, fleet)
        peak = _metric(op, "kmodkit_api_writes_in_flight_max")
        assert 1 < peak <= IN_FLIGHT
        _no_write_failed(kube_api, namespace, op)
        # One create per loader pod and one label write per node: no pass sent again
        # what an earlier one wrote before the watch had shown it (the apiserver's count).
        creates = _audited(dev_cluster, user, "create", "pods")
        assert [r["responseStatus"]["code"] for r in creates] == [201] * NODES
        assert len(_audited(dev_cluster, user, "patch", "nodes")) == NODES
    finally:
        op.stop()


@pytest.fixture
def tiny_priority_level(namespace: str, kube_api: Any) -> Iterator[None]:
    """APF for the operator's writes: a priority level of the smallest nominal concurrency
    that rejects rather than queues, so the real apiserver answers 429."""
    flow = client.FlowcontrolApiserverV1Api(kube_api)
    name = f"{namespace}-tiny"
    flow.create_priority_level_configuration(
        {
            "metadata": {"name": name},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": 1,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {"type": "Reject"},
                },
            },
        }
    )
    flow.create_flow_schema(
        {
            "metadata": {"name": name},
            "spec": {
                "priorityLevelConfiguration": {"name": name},
                "matchingPrecedence": 100,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {
                                "kind": "ServiceAccount",
                                "serviceAccount": {"name": "operator", "namespace": namespace},
                            }
                        ],
                        "resourceRules": [
                            {
                                "verbs": ["create", "patch", "update", "delete"],
                                "apiGroups": ["", "events.k8s.io"],
                                "resources": ["pods", "nodes", "events"],
                                "namespaces": ["*"],
                                "clusterScope": True,
                            }
                        ],
                    }
                ],
            },
        }
    )
    yield
    flow.delete_flow_schema(name)
    flow.delete_priority_level_configuration(name)


def _audited(
    dev_cluster: devcluster.Cluster, user: str, verb: str, resource: str
) -> list[dict[str, Any]]:
    """The audit log's records of ``user``'s ``verb`` requests on ``resource``."""
    return [
        r
        for r in audit.requests(dev_cluster.log("audit"), user)
        if r.get("verb") == verb
        and (r.get("objectRef") or {}).get("resource") == resource
        and not (r.get("objectRef") or {}).get("subresource")
    ]


def _audited_429s(dev_cluster: devcluster.Cluster, user: str) -> int:
    log = Path(dev_cluster.log("audit")).read_text(errors="replace")
    return sum(
        1 for line in log.splitlines() if f'"username":"{user}"' in line and '"code":429' in line
    )


def test_apf_throttling_is_waited_out_and_no_write_fails(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: str,
    tmp_path: Path,
    tiny_priority_level: None,
) -> None:
    op, user = _operator(
        dev_cluster, kube_api, namespace, oci_registry, tmp_path, KMODKIT_WRITE_QPS="0"
    )
    try:
        _converge(kube_api, namespace, oci_registry, fleet)
        # The real apiserver refused some writes with 429 (its audit log says so) ...
        assert _audited_429s(dev_cluster, user) > 0
        # ... not one of them was reported as failed, and each was sent again.
        _no_write_failed(kube_api, namespace, op)
        assert _metric(op, "kmodkit_api_throttled_total") > 0
    finally:
        op.stop()
