"""The real operator (``kmodkit run``) over a kwok fleet: convergence, writes, restart, joins.

The operator authenticates as a ServiceAccount so the apiserver's audit log (which
records service accounts' requests, never a body) counts its writes: that count is
the apiserver's, not the operator's own opinion of what it sent.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from kmodkit_dev import cluster as devcluster
from kmodkit_dev import procs
from kmodkit_dev import registry as devregistry
from kmodkit_dev.nodes import KERNELS, node_manifest
from kmodkit_dev.operator import Operator, launch, token_kubeconfig
from tests.bench import baseline
from tests.integration.crds_util import install

NS = "bench"
SELECTOR = {"bench": "yes"}
READY = f"kmm.node.kubernetes.io/{NS}.bench.ready"
WRITES = ("create", "update", "patch", "delete", "deletecollection")
IDLE_SECONDS = 60
JOINS = 50


@dataclass
class Figures:
    nodes: int
    baseline_s: float = 0.0
    converge_s: float = 0.0
    first_ready_s: float = 0.0
    peak_rss_mib: float = 0.0
    writes_per_node: float = 0.0
    writes: dict[str, int] = field(default_factory=dict)
    idle_writes_per_min: float = 0.0
    restart_s: float = 0.0
    restart_writes: int = 0
    join_p99_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.converge_s / self.baseline_s if self.baseline_s else 0.0


def module_body(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": "bench", "namespace": NS},
        "spec": {
            "selector": SELECTOR,
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "bench"},
                    "kernelMappings": [{"regexp": ".", "containerImage": image}],
                }
            },
        },
    }


class Audit:
    """The operator's requests as the apiserver's audit log recorded them."""

    def __init__(self, path: Path, user: str) -> None:
        self.path, self.user, self.offset = path, user, 0

    def mark(self) -> None:
        """Count from here on."""
        self.offset = self.path.stat().st_size

    def writes(self) -> dict[str, int]:
        """The writes since the mark, by resource."""
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            lines = fh.read().decode(errors="replace").splitlines()
        counts: dict[str, int] = {}
        needle = f'"username":"{self.user}"'
        for line in lines:
            if needle not in line:
                continue
            record = json.loads(line)
            if record.get("stage") != "ResponseComplete" or record.get("verb") not in WRITES:
                continue
            ref = record.get("objectRef") or {}
            kind = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
            counts[kind] = counts.get(kind, 0) + 1
        return counts


def _rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _planned_nodes(port: int) -> float:
    """Nodes the last full pass over Modules planned (0 before the first: a pass that
    waits for the caches plans nothing)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    pattern = r'^kmodkit_nodes\{[^}]*controller="modules"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def _ready_count(core: Any) -> int:
    return len(core.list_node(label_selector=READY, resource_version="0").items)


class Fleet:
    """A devcluster of ``n`` kwok nodes, the registry, and the operator as a ServiceAccount."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.name = f"bench-{secrets.token_hex(3)}"
        self.work = Path(tempfile.mkdtemp(prefix="kmodkit-bench-"))
        self.cluster = devcluster.up(self.name, nodes=0, echo=lambda _m: None)
        self.registry = devregistry.start(
            self.work / "registry", "bench", secrets.token_urlsafe(12), pki_dir=self.cluster.pki
        )
        self.api = devcluster.api_client(self.cluster)
        core: Any = client.CoreV1Api(self.api)
        self.core = core
        self.nodes = [f"b-{i:05d}" for i in range(n)]
        devcluster.add_nodes(
            self.cluster,
            [node_manifest(name, KERNELS[i % 3], SELECTOR) for i, name in enumerate(self.nodes)],
            echo=lambda _m: None,
            timeout=max(300.0, n / 10),
        )
        install(self.api)
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_secret(NS, self.registry.pull_secret("pull"))
        core.create_namespaced_service_account(NS, {"metadata": {"name": "operator"}})
        rbac: Any = client.RbacAuthorizationV1Api(self.api)
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "bench-operator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": NS}],
            }
        )
        for kernel in KERNELS:
            self.registry.push(f"{self.registry.host}/bench:{kernel}")
        self.kubeconfig = token_kubeconfig(
            self.cluster.kubeconfig, NS, "operator", self.api, self.work / "operator.kubeconfig"
        )
        self.audit = Audit(Path(self.cluster.log("audit")), f"system:serviceaccount:{NS}:operator")

    def launch_operator(self) -> tuple[Operator, int]:
        """``kmodkit run`` as the ServiceAccount, its metrics on a port of its own."""
        port = procs.free_port()
        op = launch(
            self.kubeconfig,
            self.work / "operator.log",
            "--metrics-port",
            str(port),
            KMODKIT_REGISTRY_CA=str(self.cluster.pki / "ca.crt"),
            KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:bench",
        )
        return op, port

    def measure(self) -> Figures:
        figures = Figures(self.n)
        figures.baseline_s = baseline.run(self.api, self.nodes)
        baseline.clean(self.api)
        op, _ = self.launch_operator()
        op.wait_healthy(timeout=120)
        try:
            self._converge(op, figures)
            self._idle(figures)
            op = self._restart(op, figures)
            self._joins(figures)
        finally:
            op.stop()
        return figures

    def _converge(self, op: Operator, figures: Figures) -> None:
        self.audit.mark()
        started = time.monotonic()
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "kmodkit.io",
            "v1alpha1",
            NS,
            "modules",
            module_body(f"{self.registry.host}/bench:${{KERNEL_FULL_VERSION}}"),
        )
        while (ready := _ready_count(self.core)) < self.n:
            if ready and not figures.first_ready_s:
                figures.first_ready_s = time.monotonic() - started
            if time.monotonic() - started > max(900.0, self.n / 5):
                raise RuntimeError(f"{ready}/{self.n} nodes ready; see {op.log}")
            time.sleep(0.5)
        figures.converge_s = time.monotonic() - started
        figures.first_ready_s = figures.first_ready_s or figures.converge_s
        figures.peak_rss_mib = _rss_peak_mib(op.proc.pid)
        time.sleep(5)  # the last Events of the pass
        figures.writes = self.audit.writes()
        figures.writes_per_node = sum(figures.writes.values()) / self.n

    def _idle(self, figures: Figures) -> None:
        self.audit.mark()
        time.sleep(IDLE_SECONDS)
        figures.idle_writes_per_min = sum(self.audit.writes().values()) * 60 / IDLE_SECONDS

    def _restart(self, op: Operator, figures: Figures) -> Operator:
        """SIGKILL, start again: until the first pass over the Module is done."""
        op.kill()
        self.audit.mark()
        started = time.monotonic()
        op, port = self.launch_operator()
        while _planned_nodes(port) < self.n:
            if time.monotonic() - started > 300:
                raise RuntimeError(f"no pass 300 s after the restart; see {op.log}")
            time.sleep(0.1)
        figures.restart_s = time.monotonic() - started
        time.sleep(10)
        figures.restart_writes = sum(self.audit.writes().values())
        return op

    def _joins(self, figures: Figures) -> None:
        """A node joins; how long until its loader pod exists (one join at a time)."""
        untyped: Any = watch
        took = []
        for i in range(JOINS):
            name = f"join-{i:03d}"
            listed = self.core.list_namespaced_pod(NS, resource_version="0")
            started = time.monotonic()
            self.core.create_node(node_manifest(name, KERNELS[i % 3], SELECTOR))
            for event in untyped.Watch().stream(
                self.core.list_namespaced_pod,
                NS,
                resource_version=listed.metadata.resource_version,
                timeout_seconds=120,
            ):
                if event["object"].spec.node_name == name:
                    took.append(time.monotonic() - started)
                    break
            else:
                raise RuntimeError(f"no loader pod for {name} in 120 s")
        took.sort()
        figures.join_p99_s = took[min(len(took) - 1, int(len(took) * 0.99))]

    def close(self) -> None:
        self.registry.stop()
        devcluster.down(self.name, echo=lambda _m: None)
