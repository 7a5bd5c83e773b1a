"""The real operator (``kmodkit run``) over a kwok fleet: convergence, writes, restart, joins,
and a Module update rolled across the fleet within its ``maxUnavailable`` budget.

The operator authenticates as a ServiceAccount so the apiserver's audit log (which
records service accounts' requests, never a body) counts its writes: that count is
the apiserver's, not the operator's own opinion of what it sent.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from kmodkit.core.api import Module
from kmodkit.core.engine.kernel_mapping import ResolvedMapping, resolve
from kmodkit.core.engine.loader_pod import LoaderSettings, for_node, pod_template
from kmodkit.core.nodes import NodeView
from kmodkit.core.rollout.observed import is_ready
from kmodkit_dev import cluster as devcluster
from kmodkit_dev import registry as devregistry
from kmodkit_dev.nodes import KERNELS, node_manifest
from kmodkit_dev.operator import Operator, launch_with_metrics, token_kubeconfig
from tests.bench import baseline
from tests.integration.crds_util import install

NS = "bench"
SELECTOR = {"bench": "yes"}
READY = f"kmm.node.kubernetes.io/{NS}.bench.ready"
WRITES = ("create", "update", "patch", "delete", "deletecollection")
IDLE_SECONDS = 60
JOINS = 50
ROLLOUT_REPO = "bench-next"
"""The repository of the images the rollout step moves every node to (one per kernel)."""
AGENT_IMAGE = "registry.invalid/kmodkit/agent:bench"
SIMULATE_READY_AFTER = "kmodkit.io/simulate-ready-after"
"""A pod tolerating this taint turns Ready only this long after it is bound (kwok's stages)."""


@dataclass
class Figures:
    nodes: int
    baseline_s: float = 0.0
    loader_baseline_s: float = 0.0
    """The baseline with the operator's loader pods in place of minimal ones."""
    converge_s: float = 0.0
    converge_cpu_s: float = 0.0
    """The operator's CPU time while it converged the fleet."""
    converge_apiserver_cpu_s: float = 0.0
    """The apiserver's, in the same time: what the operator's passes share the cores with."""
    first_ready_s: float = 0.0
    peak_rss_mib: float = 0.0
    writes_per_node: float = 0.0
    writes: dict[str, int] = field(default_factory=dict)
    idle_writes_per_min: float = 0.0
    restart_s: float = 0.0
    restart_writes: int = 0
    join_p99_s: float = 0.0
    rollout_nodes: int = 0
    rollout_max_unavailable: int = 0
    rollout_swap_s: float = 0.0
    rollout_s: float = 0.0
    rollout_bound_s: float = 0.0
    rollout_ratio: float = 0.0
    rollout_writes: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.converge_s / self.baseline_s if self.baseline_s else 0.0

    @property
    def loader_ratio(self) -> float:
        return self.converge_s / self.loader_baseline_s if self.loader_baseline_s else 0.0


def rollout_settings() -> tuple[int, float]:
    """The rollout step's budget (maxUnavailable, nodes) and simulated swap time (s)."""
    budget = int(os.environ.get("BENCH_ROLLOUT_MAX_UNAVAILABLE", "50"))
    swap = float(os.environ.get("BENCH_ROLLOUT_SWAP_SECONDS", "5"))
    if budget < 1 or swap <= 0:
        raise ValueError(
            "BENCH_ROLLOUT_MAX_UNAVAILABLE must be >= 1, BENCH_ROLLOUT_SWAP_SECONDS > 0"
        )
    return budget, swap


def rollout_max_nodes() -> int:
    """The largest fleet the rollout step runs on (its goal is set at 1,000 nodes; at
    10,000 it alone would be 200 waves, over 17 minutes)."""
    return int(os.environ.get("BENCH_ROLLOUT_MAX_NODES", "1000"))


def rollout_bound(nodes: int, budget: int, swap_s: float) -> float:
    """The wall time no rollout within the budget can beat: every wave of ``budget``
    nodes takes the swap time, and ``nodes`` need ceil(nodes / budget) waves."""
    return math.ceil(nodes / budget) * swap_s


def rollout_patch(image: str, budget: int, swap_s: float) -> dict[str, Any]:
    """The Module change the rollout step makes: a new module image (a change of what the
    kernel loads, so every node unloads and loads again, within the budget) whose loader
    pods turn Ready ``swap_s`` after they are bound."""
    return {
        "spec": {
            "rollout": {"maxUnavailable": budget},
            "tolerations": [
                {
                    "key": SIMULATE_READY_AFTER,
                    "operator": "Equal",
                    "value": f"{swap_s:g}s",
                    "effect": "NoSchedule",
                }
            ],
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "bench"},
                    "kernelMappings": [{"regexp": ".", "containerImage": image}],
                }
            },
        }
    }


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


def loader_pods(image: str, kernels: dict[str, str]) -> Callable[[str], dict[str, Any]]:
    """The loader pod the operator makes for each node (by the engine's own code, for the
    bench's Module and ``kernels[node]``), named ``raw-<node>`` for the baseline."""
    module = Module.model_validate(module_body(image))
    settings = LoaderSettings(agent_image=AGENT_IMAGE)
    templates = {}
    for kernel in set(kernels.values()):
        resolved = resolve(module, kernel)
        assert isinstance(resolved, ResolvedMapping), resolved  # the Module maps "."
        templates[kernel] = pod_template(module, resolved, settings)

    def pod(node: str) -> dict[str, Any]:
        view = NodeView(node, kernel=kernels[node])
        made = for_node(templates[kernels[node]], module, view)
        meta = {k: v for k, v in made["metadata"].items() if k != "namespace"}
        return {**made, "metadata": {**meta, "name": f"raw-{node}"}}

    return pod


class Audit:
    """The operator's requests as the apiserver's audit log recorded them."""

    def __init__(self, path: Path, user: str) -> None:
        self.path, self.user, self.offset, self.inode = path, user, 0, 0

    def mark(self) -> None:
        """Count from here on."""
        stat = self.path.stat()
        self.offset, self.inode = stat.st_size, stat.st_ino

    def writes(self) -> dict[str, int]:
        """The writes since the mark, by resource."""
        with self.path.open("rb") as fh:
            if os.fstat(fh.fileno()).st_ino != self.inode:
                raise RuntimeError(f"{self.path} was rotated since the mark: counts would be short")
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


def _cpu_s(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _planned_nodes(op: Operator) -> float:
    """Nodes the last full pass over Modules planned (0 before the first: a pass that
    waits for the caches plans nothing)."""
    try:
        text = op.metrics()
    except OSError:
        return 0.0
    pattern = r'^kmodkit_nodes\{[^}]*controller="modules"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def _raw_items(listed: Any) -> list[dict[str, Any]]:
    """A list call's items as plain JSON (``_preload_content=False``): the client's own
    models take seconds for a thousand pods, time the operator would lose on 2 cores."""
    items: list[dict[str, Any]] = json.loads(listed.data)["items"]
    return items


def _not_rolled(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], repo: str) -> list[str]:
    """The selected nodes that do not yet run only a new loader pod (its module image from
    ``repo``), Ready, with the Module's ready label; empty once the rollout is done."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"].get("nodeName", ""), []).append(pod)
    late = []
    for node in nodes:
        name = node["metadata"]["name"]
        mine = by_node.get(name, [])
        done = (
            READY in (node["metadata"].get("labels") or {})
            and len(mine) == 1
            and not mine[0]["metadata"].get("deletionTimestamp")
            and (mine[0]["spec"].get("initContainers") or [{}])[0].get("image", "").startswith(repo)
            and is_ready(mine[0])
        )
        if not done:
            late.append(name)
    return late


class Mirror:
    """A kind's objects as a watch delivers them (plain JSON, no client models), in a
    thread of its own, setting ``changed`` on every change: the rollout step checks its
    end on each change instead of listing the fleet again and again."""

    def __init__(self, changed: threading.Event, list_call: Any, **params: Any) -> None:
        self.changed, self._list, self._params = changed, list_call, params
        self._objects: dict[str, dict[str, Any]] = {}
        self._version = self._relist()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> Mirror:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def items(self) -> list[dict[str, Any]]:
        return list(self._objects.values())

    def _relist(self) -> str:
        listed = json.loads(self._list(**self._params, _preload_content=False).data)
        self._objects = {obj["metadata"]["name"]: obj for obj in listed["items"]}
        version: str = listed["metadata"]["resourceVersion"]
        return version

    def _follow(self) -> None:
        untyped: Any = watch
        while not self._stop.is_set():
            for event in untyped.Watch().stream(
                self._list,
                **self._params,
                resource_version=self._version,
                timeout_seconds=5,
                deserialize=False,
            ):
                obj = event["object"]
                if event["type"] == "ERROR":  # 410 Gone: the history moved on
                    self._version = self._relist()
                    break
                self._version = obj["metadata"]["resourceVersion"]
                if event["type"] == "DELETED":
                    self._objects.pop(obj["metadata"]["name"], None)
                elif event["type"] != "BOOKMARK":
                    self._objects[obj["metadata"]["name"]] = obj
                self.changed.set()


class Fleet:
    """A devcluster of ``n`` kwok nodes, the registry, and the operator as a ServiceAccount."""

    def __init__(self, n: int, labels: dict[str, str] | None = None) -> None:
        """``labels``: the nodes' labels (``SELECTOR``, which the bench's Module selects,
        when not given)."""
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
        self.kernels = {name: KERNELS[i % 3] for i, name in enumerate(self.nodes)}
        devcluster.add_nodes(
            self.cluster,
            [node_manifest(name, self.kernels[name], labels or SELECTOR) for name in self.nodes],
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
            self.registry.push(f"{self.registry.host}/{ROLLOUT_REPO}:{kernel}")
        self.kubeconfig = token_kubeconfig(
            self.cluster.kubeconfig, NS, "operator", self.api, self.work / "operator.kubeconfig"
        )
        self.audit = Audit(Path(self.cluster.log("audit")), f"system:serviceaccount:{NS}:operator")
        self.image = f"{self.registry.host}/bench:${{KERNEL_FULL_VERSION}}"

    def launch_operator(self, **env: str) -> Operator:
        """``kmodkit run`` as the ServiceAccount, its metrics on a port of its own."""
        return launch_with_metrics(
            self.kubeconfig,
            self.work / "operator.log",
            KMODKIT_REGISTRY_CA=str(self.cluster.pki / "ca.crt"),
            KMODKIT_AGENT_IMAGE=AGENT_IMAGE,
            **env,
        )

    def measure(self) -> Figures:
        figures = Figures(self.n)
        figures.baseline_s = baseline.run(self.api, self.nodes)
        baseline.clean(self.api)
        shaped = loader_pods(self.image, self.kernels)
        figures.loader_baseline_s = baseline.run(self.api, self.nodes, shaped)
        baseline.clean(self.api)
        op = self.launch_operator()
        op.wait_healthy(timeout=120)
        try:
            self._converge(op, figures)
            self._idle(figures)
            op = self._restart(op, figures)
            self._joins(figures)
            if self.n <= rollout_max_nodes():
                self._rollout(op, figures)
        finally:
            op.stop()
        return figures

    def _converge(self, op: Operator, figures: Figures) -> None:
        """From the Module's creation until every node carries its ready label, followed
        by a watch on the labelled nodes: listing them again and again would cost the
        apiserver, and this process, as much as the operator's own work at 10,000 nodes."""
        changed = threading.Event()
        with Mirror(changed, self.core.list_node, label_selector=READY) as ready:
            self.audit.mark()
            apiserver = self.cluster.pids["kube-apiserver"]
            cpu = _cpu_s(op.proc.pid), _cpu_s(apiserver)
            started = time.monotonic()
            client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                "kmodkit.io",
                "v1alpha1",
                NS,
                "modules",
                module_body(self.image),
            )
            while (count := len(ready.items())) < self.n:
                if count and not figures.first_ready_s:
                    figures.first_ready_s = time.monotonic() - started
                if time.monotonic() - started > max(900.0, self.n / 5):
                    raise RuntimeError(f"{count}/{self.n} nodes ready; see {op.log}")
                changed.wait(0.5)
                changed.clear()
            figures.converge_s = time.monotonic() - started
            figures.converge_cpu_s = _cpu_s(op.proc.pid) - cpu[0]
            figures.converge_apiserver_cpu_s = _cpu_s(apiserver) - cpu[1]
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
        op = self.launch_operator()
        while _planned_nodes(op) < self.n:
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
            # Where the watch starts: one item is enough to learn it (the whole list, as
            # models, took this process about half a minute a join at 10,000 nodes).
            listed = self.core.list_namespaced_pod(NS, limit=1)
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

    def _without_joined(self, op: Operator) -> None:
        """Take the joined nodes away again, so that the rollout covers the fleet of
        this size: the nodes go, their loader pods with them (as the pod GC would), and
        the operator's next pass covers ``n`` nodes."""
        joined = [f"join-{i:03d}" for i in range(JOINS)]
        for name in joined:
            self.core.delete_node(name)
        for pod in _raw_items(self.core.list_namespaced_pod(NS, _preload_content=False)):
            if pod["spec"].get("nodeName") not in joined:
                continue
            try:
                self.core.delete_namespaced_pod(pod["metadata"]["name"], NS, grace_period_seconds=0)
            except client.ApiException as err:
                if err.status != 404:  # the pod GC was there first
                    raise
        started = time.monotonic()
        while _planned_nodes(op) != self.n:
            if time.monotonic() - started > 120:
                raise RuntimeError(f"the operator still plans joined nodes; see {op.log}")
            time.sleep(0.5)
        time.sleep(5)  # the Module's status after that pass

    def _rollout(self, op: Operator, figures: Figures) -> None:
        """A Module update across every selected node within ``maxUnavailable``: from the
        patch until each node runs only the new loader pod, Ready, and carries the ready
        label again; against the bound the budget sets, ceil(nodes / budget) swaps."""
        budget, swap = rollout_settings()
        self._without_joined(op)
        selector = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
        selected = len(self.core.list_node(label_selector=selector, resource_version="0").items)
        figures.rollout_nodes = selected
        figures.rollout_max_unavailable, figures.rollout_swap_s = budget, swap
        figures.rollout_bound_s = rollout_bound(selected, budget, swap)
        repo = f"{self.registry.host}/{ROLLOUT_REPO}:"
        patch = rollout_patch(f"{repo}${{KERNEL_FULL_VERSION}}", budget, swap)
        limit = 5 * figures.rollout_bound_s + 300
        changed = threading.Event()
        with (
            Mirror(changed, self.core.list_node, label_selector=selector) as nodes,
            Mirror(changed, functools.partial(self.core.list_namespaced_pod, NS)) as pods,
        ):
            self.audit.mark()
            started = time.monotonic()
            client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
                "kmodkit.io", "v1alpha1", NS, "modules", "bench", patch
            )
            while True:
                changed.wait(1.0)
                time.sleep(0.1)  # the events of one write come together: one check for them
                changed.clear()
                seen = nodes.items()
                late = _not_rolled(seen, pods.items(), repo)
                elapsed = time.monotonic() - started
                if not late and len(seen) == selected:
                    break
                if elapsed > limit:
                    raise RuntimeError(
                        f"{len(late)}/{selected} nodes not rolled after {elapsed:.0f} s "
                        f"(e.g. {late[:3]}); see {op.log}"
                    )
        figures.rollout_s = elapsed
        figures.rollout_ratio = elapsed / figures.rollout_bound_s
        time.sleep(5)  # the last Events and status of the rollout
        figures.rollout_writes = self.audit.writes()

    def close(self) -> None:
        self.registry.stop()
        devcluster.down(self.name, echo=lambda _m: None)
