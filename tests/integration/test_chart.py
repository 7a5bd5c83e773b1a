"""The Helm chart with the real helm CLI: lint, schema, rendered RBAC, and a full
install / test / upgrade / uninstall cycle on the devcluster.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.core.runtime.plugins import discover
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.versions import KUBERNETES_VERSION
from kmodkit_dev.waiting import gone, wait_gone, wait_until
from tests.integration.helm import CHART, HELMS, Helm, grants

DIGEST = "sha256:" + "ab" * 32


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _operator_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's ClusterRole (the release is called kmodkit in these renders)."""
    return next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "kmodkit"
    )


def _env(docs: list[dict[str, Any]]) -> dict[str, str]:
    container = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _lease_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role.get("rules") or [] if "coordination.k8s.io" in r["apiGroups"]]


# -- without a cluster ----------------------------------------------------------


def test_lint_is_clean_for_the_defaults_and_every_switch(each_helm: Helm) -> None:
    helm = each_helm
    # Helm.run asserts the exit code; a strict lint fails on any warning.
    assert "0 chart(s) failed" in helm.run("lint", "--strict", str(CHART)).stdout
    switches = helm.run(
        "lint",
        "--strict",
        str(CHART),
        "--set",
        "openshift.enabled=true,metrics.serviceMonitor.enabled=true,controller.replicas=2",
        "--set",
        "metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true",
        "--set",
        "backends.intel_xe.enabled=false,backends.tenstorrent.enabled=false",
    )
    assert "0 chart(s) failed" in switches.stdout


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["--set", "image.digest=latest"], "at '/image/digest'"),
        (
            ["--set", "controller.replicas=2,controller.leaderElection=false"],
            "at '/controller/leaderElection'",
        ),
        (["--set", "contoller.replicas=1"], "additional properties 'contoller' not allowed"),
        (["--set", "controller.extraEnv.HTTPS_PROXY=1"], "at '/controller/extraEnv/HTTPS_PROXY'"),
        (["--set", "namespace.podSecurity=open"], "at '/namespace/podSecurity'"),
        (
            ["--set", "metrics.prometheusRule.pendingFor=5 minutes"],
            "at '/metrics/prometheusRule/pendingFor'",
        ),
        (["--set", "metrics.prometheusRule.rolloutStuckMinutes=0"], "rolloutStuckMinutes"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(
    each_helm: Helm, sets: list[str], message: str
) -> None:
    out = each_helm.run("lint", str(CHART), *sets, ok=False)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr


def test_rbac_grants_what_each_enabled_backend_declares_and_nothing_wild(helm: Helm) -> None:
    docs = helm.template()
    cluster, namespaced = grants(_operator_role(docs)), grants(_one(docs, "Role"))
    for role in (d for d in docs if d["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
    # The Tenstorrent builder labels its own node, and may do nothing else.
    labeller = next(d for d in docs if d["metadata"]["name"] == "kmodkit-tenstorrent-node-labels"
                    and d["kind"] == "ClusterRole")  # fmt: skip
    assert grants(labeller) == {("", "nodes", "patch")}
    assert ("", "nodes", "patch") in cluster and ("", "nodes", "delete") not in cluster
    assert {g for g in cluster if g[1] == "secrets"} == {("", "secrets", "get")}
    for found in discover():
        assert found.backend is not None, found.error
        for resource in found.backend.resources:
            crd = resource.crd
            for verb in ("list", "watch", "patch"):
                assert (crd.group, crd.plural, verb) in cluster, (found.name, crd.plural, verb)
            assert (crd.group, f"{crd.plural}/status", "patch") in cluster
            for w in resource.watches:
                assert {(w.group, w.plural, "list"), (w.group, w.plural, "watch")} <= cluster
            if resource.hooks is not None:
                assert ("", "pods/eviction", "create") in cluster
            for owned in resource.owns:
                group = owned.api_version.rpartition("/")[0]
                if group == "security.openshift.io":
                    continue  # granted with openshift.enabled (test_operator_pod_is_hardened)
                assert {(group, owned.plural, "list"), (group, owned.plural, "watch")} <= cluster
                writes = cluster if not owned.namespaced else cluster | namespaced
                for verb in ("create", "patch", "delete"):
                    assert (group, owned.plural, verb) in writes, (found.name, owned.kind, verb)
    assert _env(docs)["KMODKIT_BACKENDS"] == "intel_xe,tenstorrent"


def test_a_disabled_backend_gets_no_permissions(helm: Helm) -> None:
    docs = helm.template("--set", "backends.tenstorrent.enabled=false")
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"] == ["kmodkit"]
    cluster = grants(_operator_role(docs)) | grants(_one(docs, "Role"))
    assert not {g for g in cluster if "tenstorrent" in g[0]}
    assert ("", "pods/eviction", "create") not in cluster  # only rollouts evict
    assert _env(docs)["KMODKIT_BACKENDS"] == "intel_xe"
    only_engine = helm.template(
        "--set", "backends.tenstorrent.enabled=false,backends.intel_xe.enabled=false"
    )
    # The namespaced Role is left with the leader election's Lease, and without it is gone.
    assert _one(only_engine, "Role")["rules"] == _lease_rules(_one(only_engine, "Role"))
    assert _env(only_engine)["KMODKIT_BACKENDS"] == "none"
    alone = helm.template(
        "--set", "backends.tenstorrent.enabled=false,backends.intel_xe.enabled=false",
        "--set", "controller.leaderElection=false",
    )  # fmt: skip
    assert not [d for d in alone if d["kind"] == "Role"]


def test_leader_election_may_write_the_releases_lease_only(helm: Helm) -> None:
    """With controller.leaderElection (the default) every replica is told the Lease's name and
    its own pod name, and the Role lets it create a Lease in the operator namespace and read
    and write none but the release's; the chart renders no Lease itself (the operator makes
    it). Without leaderElection there is neither the setting nor the permission."""
    docs = helm.template()
    assert _env(docs)["KMODKIT_LEASE"] == "kmodkit"  # the release's full name, as the Deployment's
    container = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    (pod_name,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    role = _one(docs, "Role")
    assert role["metadata"]["namespace"] == "kmodkit-system"
    leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
    assert _lease_rules(role) == [
        {**leases, "verbs": ["create"]},  # create cannot be limited to a name
        {**leases, "resourceNames": ["kmodkit"], "verbs": ["get", "update"]},
    ]
    assert not _lease_rules(_operator_role(docs))
    assert not [d for d in docs if d["kind"] == "Lease"]

    off = helm.template("--set", "controller.leaderElection=false")
    assert not {"KMODKIT_LEASE", "POD_NAME"} & set(_env(off))
    assert not _lease_rules(_one(off, "Role"))


def test_settings_reach_the_operator_as_the_backends_read_them(helm: Helm) -> None:
    docs = helm.template(
        "--set-string",
        "controller.extraEnv.HTTPS_PROXY=http://proxy:3128,controller.extraEnv.NO_PROXY=.svc",
        "--set",
        "controller.deployGates={example.com/deploy.a,example.com/deploy.b}",
        "--set",
        f"agent.image.digest={DIGEST},image.tag=1.2.3",
    )
    env = _env(docs)
    tt = TenstorrentSettings.from_settings(env)
    assert tt.env() == [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "NO_PROXY", "value": ".svc"},
    ]
    assert tt.deploy_gates == ("example.com/deploy.a", "example.com/deploy.b")
    assert tt.service_account == "kmodkit-tenstorrent"
    assert tt.flasher_service_account == "kmodkit-tenstorrent-flasher"
    assert env["KMODKIT_AGENT_IMAGE"] == f"ghcr.io/kmodkit/agent:0.1.0@{DIGEST}"
    deployment = _one(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":1.2.3")
    assert "KMODKIT_TT_DEPLOY_GATES" not in _env(helm.template())  # the backend's default
    # The build Jobs' builder: ours (buildah), named and tagged like the chart's other images.
    assert _env(helm.template())["KMODKIT_BUILDER_IMAGE"] == "ghcr.io/kmodkit/builder:0.1.0"
    pinned = _env(helm.template("--set", f"builder.image.digest={DIGEST}"))
    assert pinned["KMODKIT_BUILDER_IMAGE"] == f"ghcr.io/kmodkit/builder:0.1.0@{DIGEST}"
    # A tt-kmd mirror reaches the builders; unset, the builder image's default stands.
    mirror = "https://git.internal/mirrors/tt-kmd.git"
    mirrored = _env(helm.template("--set", f"tenstorrent.kmdRepository={mirror}"))
    assert TenstorrentSettings.from_settings(mirrored).kmd_repository == mirror
    assert "KMODKIT_TT_KMD_REPOSITORY" not in _env(helm.template())
    bad = helm.run("lint", str(CHART), "--set", "tenstorrent.kmdRepository=not a url", ok=False)
    assert bad.returncode != 0
    assert "kmdRepository" in bad.stderr + bad.stdout


def test_the_seeds_value_names_work_as_aliases(each_helm: Helm, tmp_path: Path) -> None:
    """The upstream guides' commands: ``--set driver.image.tag=...`` (with or without
    ``driver.image.repository``) picks the Tenstorrent builder image, and
    ``controller.extraEnv`` may be a list of env entries."""
    helm = each_helm

    def builder_image(*sets: str) -> str:
        return _env(helm.template(*sets))["KMODKIT_TT_BUILDER_IMAGE"]

    assert builder_image("--set", "driver.image.tag=sha-newer") == (
        "ghcr.io/kmodkit/tenstorrent-builder:sha-newer"
    )
    assert builder_image(
        "--set", "driver.image.repository=mirror.example/tt-builder,driver.image.tag=sha-newer"
    ) == "mirror.example/tt-builder:sha-newer"  # fmt: skip
    # The alias wins over our own name, which the seed's --reuse-values keeps.
    assert builder_image(
        "--set", "tenstorrent.builderImage.tag=1.0.0,driver.image.tag=sha-newer"
    ).endswith(":sha-newer")
    assert builder_image() == "ghcr.io/kmodkit/tenstorrent-builder:0.1.0"

    values = tmp_path / "proxy.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "controller": {
                    "extraEnv": [
                        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                        {"name": "NO_PROXY", "value": ".svc"},
                    ]
                }
            }
        )
    )
    tt = TenstorrentSettings.from_settings(_env(helm.template("-f", str(values))))
    assert tt.env() == [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "NO_PROXY", "value": ".svc"},
    ]
    listed = helm.template(
        "--set", "controller.extraEnv[0].name=HTTP_PROXY,controller.extraEnv[0].value=http://p:1"
    )
    assert _env(listed)["KMODKIT_EXTRA_ENV_HTTP_PROXY"] == "http://p:1"

    bad = helm.run(
        "lint", str(CHART),
        "--set", "controller.extraEnv[0].name=HTTPS_PROXY",
        "--set", "controller.extraEnv[0].valueFrom.secretKeyRef.name=proxy",
        ok=False,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "/controller/extraEnv/0" in bad.stderr + bad.stdout
    twice = helm.run(
        "template", "kmodkit", str(CHART), "--kube-version", KUBERNETES_VERSION,
        "--set", "controller.extraEnv[0].name=NO_PROXY,controller.extraEnv[0].value=a",
        "--set", "controller.extraEnv[1].name=NO_PROXY,controller.extraEnv[1].value=b",
        ok=False,
    )  # fmt: skip
    assert twice.returncode != 0
    assert "controller.extraEnv lists NO_PROXY twice" in twice.stderr + twice.stdout


def test_operator_pod_is_hardened(helm: Helm) -> None:
    docs = helm.template()
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["memory"]
    namespace = _one(docs, "Namespace")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"
    agent = [
        d
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "kmodkit-agent"
    ]
    assert agent[0]["automountServiceAccountToken"] is False
    assert not [d for d in docs if d["kind"] == "SecurityContextConstraints"]

    openshift = helm.template("--set", "openshift.enabled=true")
    scc = _one(openshift, "SecurityContextConstraints")
    assert scc["metadata"]["name"] == "kmodkit-module-loader-scc"  # as Intel's documentation says
    # The GPU components' SCCs, written by the operator; it may not use any SCC itself.
    sccs = {g for g in grants(_operator_role(openshift)) if g[0] == "security.openshift.io"}
    assert {verb for _, _, verb in sccs} == {"list", "watch", "create", "patch", "delete"}
    assert not {g for g in grants(_operator_role(docs)) if g[0] == "security.openshift.io"}
    assert scc["users"] == [
        "system:serviceaccount:kmodkit-system:kmodkit-agent",
        "system:serviceaccount:kmodkit-system:kmodkit-tenstorrent",
    ]
    pod = _one(openshift, "Deployment")["spec"]["template"]["spec"]
    assert "runAsUser" not in pod["securityContext"]  # OpenShift assigns it


# -- on the devcluster ----------------------------------------------------------


@pytest.fixture(params=HELMS)
def release(
    request: pytest.FixtureRequest, kubeconfig: str, kube_api: Any, namespace: str, tmp_path: Path
) -> Iterator[tuple[Helm, str, str]]:
    """A release name and its own operator namespace; uninstalled if a test fails midway."""
    helm = Helm(tmp_path, kubeconfig, tool=request.param)
    name = f"km-{uuid.uuid4().hex[:6]}"
    yield helm, name, f"{name}-system"
    helm.run("uninstall", name, "-n", namespace, "--wait", ok=False)


def _replica_sets(kube_api: Any, ns: str) -> set[str]:
    items = client.AppsV1Api(kube_api).list_namespaced_replica_set(ns).items
    return {rs.metadata.name for rs in items}


@pytest.mark.cluster
def test_install_test_upgrade_and_uninstall(
    release: tuple[Helm, str, str], kube_api: Any, namespace: str
) -> None:
    helm, name, ns = release
    common = ["-n", namespace, "--set", f"namespace.name={ns}", "--wait", "--timeout", "120s"]
    # --take-ownership: the admission policies may exist already (other tests apply crds/,
    # and charts before this one shipped them in crds/, where Helm does not own them).
    # Helm 4 applies crds/ on install even where they exist, and other tests may have
    # applied them under their own field manager.
    forced = ["--force-conflicts"] if helm.major == 4 else []
    helm.run("install", name, str(CHART), *common, "--take-ownership", *forced)
    apps = client.AppsV1Api(kube_api)
    admission = client.AdmissionregistrationV1Api(kube_api)
    policy = admission.read_validating_admission_policy("modules.kmodkit.io-name-length")
    assert policy.metadata.annotations["meta.helm.sh/release-name"] == name
    deployment = apps.read_namespaced_deployment(f"{name}-kmodkit", ns)
    assert deployment.status.ready_replicas == 1
    labels = client.CoreV1Api(kube_api).read_namespace(ns).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    helm.run("test", name, "-n", namespace, "--timeout", "120s")

    first = _replica_sets(kube_api, ns)
    helm.run(
        "upgrade", name, str(CHART), *common,
        "--set-string", "controller.extraEnv.HTTPS_PROXY=http://proxy.example:3128",
    )  # fmt: skip
    second = _replica_sets(kube_api, ns)
    assert len(second - first) == 1, "a changed pod template rolls out a new ReplicaSet"
    env = {
        e.name: e.value
        for e in apps.read_namespaced_deployment(f"{name}-kmodkit", ns)
        .spec.template.spec.containers[0]
        .env
    }
    assert env["KMODKIT_EXTRA_ENV_HTTPS_PROXY"] == "http://proxy.example:3128"
    wait_until(
        lambda: apps.read_namespaced_deployment(f"{name}-kmodkit", ns).status.updated_replicas == 1,
        "the upgraded replica",
    )

    helm.run("rollback", name, "1", "-n", namespace, "--wait", "--timeout", "120s")
    env = {
        e.name
        for e in apps.read_namespaced_deployment(f"{name}-kmodkit", ns)
        .spec.template.spec.containers[0]
        .env
    }
    assert "KMODKIT_EXTRA_ENV_HTTPS_PROXY" not in env, "the rollback restores revision 1"
    assert _replica_sets(kube_api, ns) == second, "revision 1's ReplicaSet serves again"

    helm.run("uninstall", name, "-n", namespace, "--wait", "--timeout", "120s")
    rbac = client.RbacAuthorizationV1Api(kube_api)
    selector = f"app.kubernetes.io/instance={name}"
    assert not rbac.list_cluster_role(label_selector=selector).items
    assert not rbac.list_cluster_role_binding(label_selector=selector).items
    # The admission policies were the release's: they go with it (only CRDs stay).
    policies = {p.metadata.name for p in admission.list_validating_admission_policy().items}
    assert "modules.kmodkit.io-name-length" not in policies

    wait_gone(lambda: client.CoreV1Api(kube_api).read_namespace(ns), f"namespace {ns}", 90)
    # The operator's Lease is not the release's (the operator creates it and, stopping,
    # releases it without deleting it; here kwok runs no operator, so there is none): one
    # would have lived in the release's namespace and gone with it.
    leases = client.CoordinationV1Api(kube_api)
    assert gone(lambda: leases.read_namespaced_lease(f"{name}-kmodkit", ns))
    crds = client.ApiextensionsV1Api(kube_api)
    crd = "modules.kmodkit.io"
    assert crds.read_custom_resource_definition(crd).metadata.name == crd  # kept


@pytest.mark.cluster
def test_two_replicas_with_one_lease_take_turns(
    kubeconfig: str, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    """controller.replicas > 1: two operators on one Lease both start and answer /healthz, but
    only one holds the Lease (it keeps renewing it while the other keeps waiting), and when
    the holder stops (SIGTERM) it releases the Lease and the waiting one takes it over at once,
    well before the 15 s in which a dead holder's Lease would have to stay unchanged."""
    lease = f"lease-{uuid.uuid4().hex[:6]}"
    leases = client.CoordinationV1Api(kube_api)
    env = {"KMODKIT_BACKENDS": "none", "KMODKIT_LEASE": lease, "KMODKIT_NAMESPACE": namespace}

    def read() -> Any:
        try:
            return leases.read_namespaced_lease(lease, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def holder() -> str:
        found = read()
        return (found.spec.holder_identity or "") if found is not None else ""

    # Each replica names itself in the Lease by its POD_NAME plus a random suffix.
    with (
        running_operator(kubeconfig, tmp_path / "a.log", **env, POD_NAME="replica-a") as a,
        running_operator(kubeconfig, tmp_path / "b.log", **env, POD_NAME="replica-b") as b,
    ):
        pods: dict[str, Operator] = {"replica-a": a, "replica-b": b}

        def holding() -> list[Operator]:
            identity = holder()
            return [op for pod, op in pods.items() if identity.startswith(pod)]

        (active,) = wait_until(holding, "one replica to take the Lease")
        waiting = b if active is a else a
        first = read()
        time.sleep(5)  # two renewals and more: the holder renews, the other stays waiting
        later = read()
        assert later.spec.holder_identity == first.spec.holder_identity, "the Lease changed hands"
        assert later.metadata.resource_version != first.metadata.resource_version, "no renewal"
        assert waiting.health() is not None, "the waiting replica answers /healthz"

        active.stop()
        wait_until(
            lambda: holding() == [waiting],
            "the waiting replica to take over the released Lease",
            timeout=10,
        )
