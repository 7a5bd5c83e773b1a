"""On a cluster that serves OpenShift's SecurityContextConstraints, the GPU components get
theirs, accepted by OpenShift's own CRD schema (github.com/openshift/api, pinned).

The control plane is Kubernetes, not OpenShift: nothing here enforces an SCC, so this
checks what the operator writes (the SCC objects, their users, the pods' accounts)
and that OpenShift's schema takes them, not OpenShift's admission of the pods.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import manifests as devmanifests
from kmodkit_dev import openshift_crds
from kmodkit_dev.operator import Operator
from kmodkit_dev.waiting import wait_until
from tests.integration import intel_support
from tests.integration.crds_util import install
from tests.integration.helm import Helm
from tests.integration.intel_support import CP_GROUP, CP_PLURAL, CP_VERSION

pytestmark = pytest.mark.cluster

SCC = ("security.openshift.io", "v1", "securitycontextconstraints")


@pytest.fixture(scope="module")
def openshift_api(kube_api: Any) -> Iterator[None]:
    crd = openshift_crds.scc_crd()
    devmanifests.install(kube_api, [crd])
    yield
    devmanifests.uninstall_crds(kube_api, [crd])


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any) -> Iterator[str]:
    labels = {"resource.kubernetes.io/admin-access": "true"}
    yield from intel_support.operator_namespace(kube_api, "ocp", labels=labels)


@pytest.fixture(scope="module")
def operator(
    openshift_api: None,
    kube_api: Any,
    kubeconfig: str,
    operator_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    install(kube_api)
    log = tmp_path_factory.mktemp("intel-openshift") / "operator.log"
    with intel_support.intel_operator(kubeconfig, log, operator_namespace) as op:
        yield op


def _scc(kube_api: Any, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.CustomObjectsApi(kube_api).get_cluster_custom_object(*SCC, name))
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def test_each_gpu_component_gets_its_own_scc_and_account(
    operator: Operator, kube_api: Any, operator_namespace: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    names = {"dp": f"dp{tag}", "dra": f"dra{tag}"}
    objects = client.CustomObjectsApi(kube_api)
    for mode, name in names.items():
        policy = {
            "apiVersion": f"{CP_GROUP}/{CP_VERSION}",
            "kind": "ClusterPolicy",
            "metadata": {"name": name},
            "spec": {
                "resourceRegistration": mode,
                "resourceMonitoring": True,
                "nodeSelector": {"openshift-test": tag},
            },
        }
        objects.create_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, policy)
    try:
        ns = operator_namespace
        wanted = {
            f"{names['dp']}-gpu-dp-scc": f"{names['dp']}-gpu-dp-sa",
            f"{names['dp']}-xpu-manager-scc": f"{names['dp']}-xpu-manager-sa",
            f"{names['dra']}-gpu-dra-scc": f"{names['dra']}-gpu-dra",
        }
        for scc, account in wanted.items():
            found = wait_until(lambda s=scc: _scc(kube_api, s), f"the SCC {scc}", timeout=60)
            assert found["users"] == [f"system:serviceaccount:{ns}:{account}"]
            assert found["allowPrivilegedContainer"] is False
            client.CoreV1Api(kube_api).read_namespaced_service_account(account, ns)
        xpu = wait_until(
            lambda: _scc(kube_api, f"{names['dp']}-xpu-manager-scc"), "the XPU Manager's SCC"
        )
        assert xpu["allowedCapabilities"] == ["SYS_ADMIN"]
        apps = client.AppsV1Api(kube_api)
        plugin = apps.read_namespaced_daemon_set(f"{names['dp']}-device-plugin", ns)
        assert plugin.spec.template.spec.service_account_name == f"{names['dp']}-gpu-dp-sa"
    finally:
        for name in names.values():
            objects.delete_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, name)


def test_the_charts_loader_scc_is_accepted_by_openshifts_schema(
    openshift_api: None, kube_api: Any, tmp_path: Path
) -> None:
    docs = Helm(tmp_path).template("--set", "openshift.enabled=true")
    (scc,) = [d for d in docs if d["kind"] == "SecurityContextConstraints"]
    created = client.CustomObjectsApi(kube_api).create_cluster_custom_object(
        *SCC, scc, dry_run="All", field_validation="Strict"
    )
    assert created["metadata"]["name"] == "kmodkit-module-loader-scc"
