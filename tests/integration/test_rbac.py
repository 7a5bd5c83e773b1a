"""Least privilege, proven live: the real operator with only the chart's ServiceAccount token.

The chart is installed (Module engine only, peering on), a token is requested for
its ServiceAccount, and the real operator drives a Module through a build, loading
on kwok nodes and deletion with nothing but that token. The apiserver's audit log
then says which permissions were used: none may have been refused, and every one
granted must have been used or be justified in docs/security.md. The same run
checks the operator's metrics and ``kubectl kmodkit``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from devcluster import build, procs
from devcluster import cluster as devcluster
from devcluster.nodes import node_manifest
from devcluster.operator import running_operator
from devcluster.registry import Registry
from tests.integration.test_chart import CHART, Grant, Helm, grants
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
PUSHED, BUILT, UNMAPPED = "6.8.0-45-generic", "7.0.0-14-generic", "5.14.0-427.el9.x86_64"


def justified() -> set[Grant]:
    """(group, resource, verb) rows of docs/security.md's list of unexercised permissions."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("### Granted but not exercised by the RBAC test", 1)[1].split("\n#", 1)[0]
    found = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and not cells[0].startswith(("API group", "---")):
            group, _, resource = cells[0].rpartition("/")
            found.add((group, resource, cells[1]))
    return found


def used_and_refused(audit_log: Path, user: str) -> tuple[set[Grant], list[str]]:
    used: set[Grant] = set()
    refused = []
    for line in audit_log.read_text(encoding="utf-8").splitlines():
        ev = json.loads(line)
        if ev.get("user", {}).get("username") != user or "objectRef" not in ev:
            continue
        ref = ev["objectRef"]
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
        grant = (ref.get("apiGroup", ""), resource, ev["verb"])
        if ev.get("responseStatus", {}).get("code") == 403:
            refused.append(f"{ev['verb']} {ev['requestURI']}")
        else:
            used.add(grant)
    return used, refused


def token_kubeconfig(admin: Path, namespace: str, account: str, kube_api: Any, out: Path) -> Path:
    """A kubeconfig that authenticates as ``account`` with a TokenRequest token, nothing else."""
    request = client.CoreV1Api(kube_api).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    cfg = json.loads(admin.read_text())
    cfg["users"] = [{"name": account, "user": {"token": request.status.token}}]
    cfg["contexts"][0]["context"]["user"] = account
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out


class Builder(threading.Thread):
    """Plays kaniko: pushes the image each new build Job names."""

    def __init__(self, kube_api: Any, namespace: str, reg: Registry) -> None:
        super().__init__(daemon=True)
        self.kube_api, self.namespace, self.reg = kube_api, namespace, reg
        self.stopped = threading.Event()

    def run(self) -> None:
        batch = client.BatchV1Api(self.kube_api)
        seen: set[str] = set()
        while not self.stopped.is_set():
            # Short watches, so a stop is noticed without a connection cut under the thread.
            for ev in watch.Watch().stream(
                batch.list_namespaced_job, self.namespace, timeout_seconds=2
            ):
                job = ev["object"]
                if job.metadata.name not in seen:
                    seen.add(job.metadata.name)
                    self.reg.push(job.metadata.annotations["kmodkit.io/image"])

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


@pytest.fixture
def fleet(dev_cluster: devcluster.Cluster, kube_api: Any) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    kernels = {"a0": PUSHED, "a1": PUSHED, "b0": BUILT, "c0": UNMAPPED}
    names = [f"rbac-{tag}-{k}" for k in kernels]
    devcluster.add_nodes(
        dev_cluster,
        [node_manifest(n, kernels[n.rsplit("-", 1)[1]], {"rbac-test": tag}) for n in names],
    )
    yield tag, names
    for n in names:
        client.CoreV1Api(kube_api).delete_node(n)


def _module(tag: str, reg: Registry) -> dict[str, Any]:
    image = f"{reg.host}/kmods/rbac:${{KERNEL_FULL_VERSION}}"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": "xe"},
        "spec": {
            "selector": {"rbac-test": tag},
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "kernelMappings": [
                        {"literal": PUSHED, "containerImage": image},
                        {
                            "literal": BUILT,
                            "containerImage": image,
                            "build": {"dockerfileConfigMap": {"name": "xe-build"}},
                        },
                    ],
                }
            },
        },
    }


def _metrics(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _kubectl_kmodkit(kubeconfig: str, *args: str) -> str:
    """``kubectl kmodkit …`` found on PATH the way kubectl finds plugins."""
    build.ensure(["kubernetes"])
    kubectl = str(build.binary("kubectl"))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    out = subprocess.run(
        [kubectl, "kmodkit", *args],
        env={**os.environ, "PATH": path, "KUBECONFIG": kubeconfig, "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_operator_runs_a_module_with_only_the_charts_permissions(
    dev_cluster: devcluster.Cluster,
    kubeconfig: str,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    tag, names = fleet
    helm = Helm(tmp_path, kubeconfig)
    release = f"rb-{tag}"
    ns = f"{release}-system"
    account = f"{release}-kmodkit"
    helm.run(
        "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "120s",
        "--set", f"namespace.name={ns}",
        "--set", "backends.intel_xe.enabled=false,backends.tenstorrent.enabled=false",
    )  # fmt: skip
    try:
        _drive(dev_cluster, kubeconfig, kube_api, namespace, oci_registry, tag, names, tmp_path,
               ns, account, release)  # fmt: skip
    finally:
        helm.run("uninstall", release, "-n", namespace, "--wait", ok=False)


def _drive(
    dev_cluster: devcluster.Cluster,
    kubeconfig: str,
    kube_api: Any,
    namespace: str,
    reg: Registry,
    tag: str,
    names: list[str],
    tmp_path: Path,
    ns: str,
    account: str,
    release: str,
) -> None:
    token_config = token_kubeconfig(
        dev_cluster.kubeconfig, ns, account, kube_api, tmp_path / "operator.kubeconfig"
    )
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "pull"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {
                ".dockerconfigjson": base64.b64encode(reg.dockerconfigjson().encode()).decode()
            },
        },
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "xe-build"}, "data": {"dockerfile": "FROM scratch\n"}}
    )
    reg.push(f"{reg.host}/kmods/rbac:{PUSHED}")
    objects = client.CustomObjectsApi(kube_api)
    metrics_port = procs.free_port()
    builder = Builder(kube_api, namespace, reg)
    builder.start()
    ready = f"kmm.node.kubernetes.io/{namespace}.xe.ready"
    mapped = [n for n in names if not n.endswith("-c0")]
    with running_operator(
        str(token_config),
        tmp_path / "operator.log",
        KMODKIT_NAMESPACE=ns,
        KMODKIT_BACKENDS="none",
        KMODKIT_PEERING=account,
        KMODKIT_METRICS_PORT=str(metrics_port),
        KMODKIT_REGISTRY_CA=str(reg.ca),
        KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:test",
    ) as op:
        try:
            objects.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _module(tag, reg)
            )
            wait_until(
                lambda: all(ready in (core.read_node(n).metadata.labels or {}) for n in mapped),
                "ready labels on the mapped nodes",
                timeout=90,
            )
        finally:
            builder.stop()
        policy = f"{namespace}/xe"
        metrics = wait_until(
            lambda: (
                (m := _metrics(metrics_port)).get(
                    ("kmodkit_nodes", _labels(controller=PLURAL, policy=policy, state="Loaded"))
                )
                == len(mapped)
                and m.get(
                    (
                        "kmodkit_jobs_finished_total",
                        _labels(component="module-build", outcome="succeeded"),
                    )
                )
                == 1
                and m
            ),
            "metrics: loaded nodes and the finished build",
        )
        assert metrics[("kmodkit_reconcile_total", _labels(controller=PLURAL, result="ok"))] > 0
        assert (
            metrics[("kmodkit_nodes", _labels(controller=PLURAL, policy=policy, state="Failed"))]
            == 1
        )
        every_node = {n.metadata.name for n in core.list_node().items}
        for (name, labels), _ in metrics.items():
            keys = {k for k, _ in labels}
            values = {v for _, v in labels}
            assert not keys & {"node", "node_name", "nodename", "hostname", "instance"}, name
            assert not values & every_node, f"{name} carries a node name: {labels}"

        table = _kubectl_kmodkit(kubeconfig, "status")
        line = next(ln for ln in table.splitlines() if f"{namespace}/xe" in ln)
        assert "Module" in line and "kmodkit" in line
        assert re.search(rf"loaded={len(mapped)}/\d", line), line
        assert "NoMapping" in line and names[-1] in line
        node = _kubectl_kmodkit(kubeconfig, "status", "--node", mapped[0])
        assert ready in node and "ModuleLoaded" in node and PUSHED in node

        objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "xe")

        def released() -> bool:
            try:
                objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "xe")
            except ApiException as e:
                return e.status == 404
            return False

        wait_until(released, "the Module to be unloaded everywhere and released", timeout=60)
        wait_until(
            lambda: (
                ("kmodkit_nodes", _labels(controller=PLURAL, policy=policy, state="Loaded"))
                not in _metrics(metrics_port)
            ),
            "a deleted Module's series to go",
        )
        assert op.proc.poll() is None

    user = f"system:serviceaccount:{ns}:{account}"
    used, refused = used_and_refused(dev_cluster.log("audit"), user)
    assert not refused, f"the chart's RBAC refused the operator: {refused}"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    role = json.loads(rbac.read_cluster_role(account, _preload_content=False).data)
    granted = grants(role)
    print(f"permissions used by the operator: {sorted(used)}")
    assert justified() <= granted, "docs/security.md justifies permissions the chart lacks"
    unused = granted - used - justified()
    assert not unused, (
        f"granted but never used: {sorted(unused)}; drop them from the chart or justify them "
        "in docs/security.md"
    )


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())
