"""The informers' HTTP client on the real apiserver: a service account's token read
again from its file when the apiserver refuses the old one (the kubelet rotates it),
and TLS verified against the configuration's CA."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from kmodkit.core.nodes import slim_node
from kmodkit.core.runtime.informer import Informer, kind_lister
from kmodkit.core.runtime.informer_http import client_for
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.operator import service_account_token

pytestmark = pytest.mark.cluster
LABEL = "kmodkit.io/informer-http-test"
RBAC_GROUP = "rbac.authorization.k8s.io"


@pytest.fixture
def readers(kube_api: Any, namespace: str) -> Iterator[tuple[str, str]]:
    """Two service accounts that may list and watch nodes."""
    rbac: Any = client.RbacAuthorizationV1Api(kube_api)
    core: Any = client.CoreV1Api(kube_api)
    role = f"node-reader-{uuid.uuid4().hex[:8]}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}],
        }
    )
    accounts = ("first", "second")
    for account in accounts:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
            "subjects": [
                {"kind": "ServiceAccount", "name": a, "namespace": namespace} for a in accounts
            ],
        }
    )
    try:
        yield accounts
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)


def _refused(server: str, ca: Path, token: str) -> bool:
    """Whether the apiserver answers this token with 401."""
    import ssl
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{server}/api/v1/nodes?limit=1", headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=5, context=context):
            return False
    except urllib.error.HTTPError as err:
        return err.code == 401


def test_a_rotated_service_account_token_is_read_again_when_the_old_one_is_refused(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    namespace: str,
    readers: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = readers
    account = tmp_path / "serviceaccount"
    account.mkdir()
    ca = dev_cluster.pki / "ca.crt"
    shutil.copy(ca, account / "ca.crt")
    (account / "namespace").write_text(namespace)
    (account / "token").write_text(service_account_token(kube_api, namespace, first))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(dev_cluster.ports["kube-apiserver"]))
    tag = uuid.uuid4().hex[:8]
    core: Any = client.CoreV1Api(kube_api)
    late = f"rotated-{tag}"

    async def names_after_rotation() -> set[str]:
        """The node names in the cache once the node made after the rotation is in it, or
        30 s after it was made."""
        api = client_for(KubeConfig.from_service_account(account))
        informer: Informer[dict[str, Any]] = Informer(
            "nodes",
            kind_lister("", "v1", "nodes")(api),
            view=slim_node,
            label_selector=f"{LABEL}={tag}",
            watch_timeout=1,  # a new request every second: each authenticates anew
            backoff=(0.1, 0.5),
        )
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            # The kubelet's rotation: a new token in the file; the old one is refused
            # from now on (its account is gone).
            old = (account / "token").read_text()
            (account / "token").write_text(service_account_token(kube_api, namespace, second))
            core.delete_namespaced_service_account(first, namespace)
            while not _refused(dev_cluster.server, ca, old):
                await asyncio.sleep(0.2)
            core.create_node({"metadata": {"name": late, "labels": {LABEL: tag}}})
            for _ in range(150):
                if ("", late) in informer.views():
                    break
                await asyncio.sleep(0.2)
            return {name for _, name in informer.views()}
        finally:
            await informer.stop()
            await api.aclose()

    try:
        names = asyncio.run(names_after_rotation())
        assert late in names, "the informer stopped reading once the old token was refused"
    finally:
        for node in core.list_node(label_selector=f"{LABEL}={tag}").items:
            core.delete_node(node.metadata.name)


def test_an_apiserver_the_configured_ca_does_not_vouch_for_is_not_read(
    dev_cluster: devcluster.Cluster, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.crt"
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    made = ["-keyout", str(tmp_path / "other-ca.key"), "-out", str(other)]
    subject = ["-subj", "/CN=not the cluster's CA", "-days", "1"]
    subprocess.run(
        ["openssl", "req", "-x509", *key, *made, *subject], check=True, capture_output=True
    )
    config = KubeConfig.from_one(
        cluster=Cluster(server=dev_cluster.server, certificate_auth=str(other)),
        user=User(token="unused"),
    )

    async def run() -> None:
        api = client_for(config)
        try:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await api.get("/version", {}, 5)
        finally:
            await api.aclose()

    asyncio.run(run())
