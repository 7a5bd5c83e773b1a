"""The Tenstorrent pods' API access, enforced by the real apiserver.

The chart's builder account may patch nodes (RBAC cannot name "its own node"),
so the chart's ValidatingAdmissionPolicy confines it: with the token of a
builder pod bound to a node it may set the labels the builder owns on that
node, and nothing else: no other node, no other label, no cordon, no
annotation, and no patch at all from a token that names no node. The flash
pods' account is bound to no role and mounts no token. The chart is rendered
by the real helm and its objects are applied as they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.versions import KUBERNETES_VERSION
from kmodkit_dev.waiting import wait_until
from tests.integration.helm import CHART, Helm
from tests.integration.test_tt_support import add_fleet, delete_nodes

pytestmark = pytest.mark.cluster

INSTALL_MODE = "driver.tenstorrent.com/install-mode"
MERGE = "application/merge-patch+json"
CLUSTER_KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@dataclass
class Chart:
    namespace: str
    builder: str
    flasher: str
    docs: list[dict[str, Any]]


def _tenstorrent_docs(docs: list[dict[str, Any]], accounts: set[str]) -> list[dict[str, Any]]:
    """The chart's objects for the Tenstorrent pods: their accounts, roles and policy."""
    return [
        d
        for d in docs
        if d["metadata"]["name"] in accounts
        or (d["kind"] in CLUSTER_KINDS and "tenstorrent" in d["metadata"]["name"])
    ]


@pytest.fixture
def chart(kube_api: Any, helm: Helm) -> Iterator[Chart]:
    tag = uuid.uuid4().hex[:6]
    release, namespace = f"ttadm-{tag}", f"ttadm-{tag}-system"
    out = helm.run(
        "template", release, str(CHART), "--kube-version", KUBERNETES_VERSION,
        "--set", f"namespace.name={namespace},tenstorrent.serviceAccount.name=ttb-{tag}",
    )  # fmt: skip
    import yaml

    accounts = {f"ttb-{tag}", f"ttb-{tag}-flasher"}
    docs = _tenstorrent_docs([d for d in yaml.safe_load_all(out.stdout) if d], accounts)
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"} == accounts
    client.CoreV1Api(kube_api).create_namespace({"metadata": {"name": namespace}})
    untyped: Any = dynamic
    dyn = untyped.DynamicClient(kube_api)
    for doc in docs:
        dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).create(
            body=doc, namespace=doc["metadata"].get("namespace")
        )
    try:
        yield Chart(namespace, f"ttb-{tag}", f"ttb-{tag}-flasher", docs)
    finally:
        for doc in reversed(docs):
            if doc["kind"] != "ServiceAccount":
                dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).delete(
                    name=doc["metadata"]["name"]
                )
        client.CoreV1Api(kube_api).delete_namespace(namespace, propagation_policy="Background")


def _pod_token(kube_api: Any, namespace: str, account: str, node: str) -> str:
    """The token a pod of ``account`` running on ``node`` gets (bound to the pod, so it
    carries the node's name, as the kubelet's projected token does)."""
    core = client.CoreV1Api(kube_api)
    pod = core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": f"builder-{node}"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": account,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "registry.invalid/builder:1"}],
            },
        },
    )
    request = core.create_namespaced_service_account_token(
        account,
        namespace,
        {
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                },
            }
        },
    )
    return str(request.status.token)


def _plain_token(kube_api: Any, namespace: str, account: str) -> str:
    request = client.CoreV1Api(kube_api).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return str(request.status.token)


def _as(dev_cluster: devcluster.Cluster, kube_api: Any, token: str) -> client.CoreV1Api:
    config = client.Configuration()
    base = kube_api.configuration
    config.host, config.ssl_ca_cert = base.host, base.ssl_ca_cert
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(config))


def _refusal(core: client.CoreV1Api, node: str, body: dict[str, Any]) -> str | None:
    """The apiserver's message if it refuses the patch, None if it applies it."""
    try:
        core.patch_node(node, body, _content_type=MERGE)
    except ApiException as err:
        assert err.status in (403, 422), err
        return str(err.body)
    return None


def test_the_builder_may_label_only_its_own_node_and_only_its_labels(
    dev_cluster: devcluster.Cluster, kube_api: Any, chart: Chart
) -> None:
    tag = chart.builder
    own, other = f"{tag}-a", f"{tag}-b"
    add_fleet(dev_cluster, kube_api, [own, other], {"ttadm-test": tag})
    try:
        builder = _as(dev_cluster, kube_api, _pod_token(kube_api, chart.namespace, tag, own))

        def label(node: str, value: str) -> dict[str, Any]:
            return {"metadata": {"labels": {INSTALL_MODE: value}}}

        # The policy takes effect a moment after it is created.
        wait_until(
            lambda: _refusal(builder, other, label(other, "container")) is not None,
            "the admission policy in force",
        )
        assert "may patch only its own node, not node " + other in str(
            _refusal(builder, other, label(other, "container"))
        )
        assert _refusal(builder, own, label(own, "container")) is None
        assert _refusal(builder, own, {"metadata": {"labels": {INSTALL_MODE: None}}}) is None
        cases = {
            "another label": {"metadata": {"labels": {"ttadm-test": "stolen"}}},
            "a new label": {"metadata": {"labels": {"example.com/x": "y"}}},
            "a cordon": {"spec": {"unschedulable": True}},
            "an annotation": {"metadata": {"annotations": {"example.com/x": "y"}}},
        }
        for what, body in cases.items():
            message = _refusal(builder, own, body)
            assert message is not None, f"the builder could change {what} of its node"
            assert "Tenstorrent builder may" in message, message

        unbound = _as(dev_cluster, kube_api, _plain_token(kube_api, chart.namespace, tag))
        assert "its token names no node" in str(_refusal(unbound, own, label(own, "host")))
    finally:
        delete_nodes(kube_api, [own, other])


def test_flash_pods_account_has_no_role_and_no_token(
    dev_cluster: devcluster.Cluster, kube_api: Any, chart: Chart
) -> None:
    (account,) = [
        d
        for d in chart.docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == chart.flasher
    ]
    assert account["automountServiceAccountToken"] is False
    bound = {
        s.get("name")
        for d in chart.docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in d.get("subjects") or []
    }
    assert chart.flasher not in bound
    node = f"{chart.flasher}-n"
    add_fleet(dev_cluster, kube_api, [node], {"ttadm-test": chart.flasher})
    try:
        flasher = _as(dev_cluster, kube_api, _plain_token(kube_api, chart.namespace, chart.flasher))
        with pytest.raises(ApiException) as refused:
            flasher.patch_node(
                node, {"metadata": {"labels": {INSTALL_MODE: "x"}}}, _content_type=MERGE
            )
        assert refused.value.status == 403
    finally:
        delete_nodes(kube_api, [node])
