"""``make bench``, first: one reconcile pass of each backend resource over a large fleet.

The goal (issue "fleet scale"): a TenstorrentDriverPolicy and a TenstorrentFirmwarePolicy,
each over 1,000 nodes, and likewise Intel's ClusterPolicy: one reconcile pass costs at most
0.5 s of operator CPU. The fleet size is BENCH_PASS_NODES (default 1000).

A pass is what the operator runs for one object each time it wakes:
``ResourceController.reconcile`` (kmodkit/core/runtime/resource_controller.py), unchanged.
The backend's pure plan runs on a ClusterView built from the node cache (filled through
``Shared.nodes_changed``, as the node informer fills it) and from the watched and owned objects
(copied into lists, as the kopf daemon copies them out of its indexes). When the plan asks for a
rollout, the rollout pass follows (``kmodkit.core.rollout.reconcile``: the backend's hooks, every
targeted node observed, the rollout plan, then the node writes, evictions and Events of its
steps). Then come the status write and the Events. Each pass is timed with
``time.process_time()`` (every thread of this process), after one warm-up pass on the same
state; the median of three passes is reported.

Nothing leaves the process. Two stand-ins take the place of the API; both record writes and
send none. ``StandInPool`` replaces the ApiClient's connection pool, so the client still does
its own work for each request (serializing the request, parsing the answer) but nothing goes
over the network. It answers from the fleet fixture the few reads a pass makes: the nodes in
flight, the pods on a node being drained, a flash Job. ``Applied`` replaces the dynamic client
that the runtime's server-side apply and prune go through. Between the passes that set a
scenario up, the bench applies the recorded node writes to its fixture and hands them to the
node cache, and the status to the object, as the apiserver and the watches would. The timed
passes all see the same state.

Each resource is timed in two states:

- converged: every node already runs the policy's version (node labels and annotations, builder
  pods Ready from the current template, the last rollout's finished flash pods, the owned
  DaemonSets and Module reporting every node). Such a pass writes nothing except the
  server-side applies the runtime makes on every pass;
- rolling: the version was bumped, and the real passes have since marked every node
  ``required`` and taken the first one to evicting. That node's device-holding pod is evicted
  again on every pass, as happens while it terminates. The ClusterPolicy's pass has no rollout:
  its kernelModule version is bumped and its Module reports half the fleet loaded.

Not included: the apiserver's work and the network; kopf's and the informer's handling of watch
events (paid per event, not per pass); the passes of the Module engine that loads the Intel
driver on each node (``loader_plan`` measures the engine's plan); the builder and flash pods.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
import yaml
from kubernetes import client

from kmodkit.backends.intel_xe import CLUSTER_POLICY
from kmodkit.backends.intel_xe.claims import CLAIMS
from kmodkit.backends.intel_xe.xpu_manager import ADMIN_ACCESS_LABEL, ADMIN_NAMESPACES
from kmodkit.backends.tenstorrent import backend as tenstorrent
from kmodkit.backends.tenstorrent import keys as tt
from kmodkit.backends.tenstorrent import names
from kmodkit.backends.tenstorrent.driver_plan import BUILDER_SETS, BUILDERS
from kmodkit.backends.tenstorrent.driver_plan import POLICIES as DRIVER_POLICIES
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.firmware_job import flash_job
from kmodkit.backends.tenstorrent.firmware_plan import FLASHERS
from kmodkit.backends.tenstorrent.firmware_plan import POLICIES as FIRMWARE_POLICIES
from kmodkit.backends.tenstorrent.settings import DEFAULT_DEPLOY_GATES, TenstorrentSettings
from kmodkit.core.cli.render import OFFLINE_API_GROUPS
from kmodkit.core.contract.backend import Resource
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.nodes import slim_node
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.states import NEEDS_PODS, parse_state
from kmodkit.core.runtime import metrics
from kmodkit.core.runtime.informer_cache import Change
from kmodkit.core.runtime.kube import Kube
from kmodkit.core.runtime.resource_controller import ResourceController, _identity, watched_view
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import WriteSettings
from kmodkit_dev.nodes import INTEL_GPU_LABELS, KERNELS, TENSTORRENT_LABELS, node_manifest

Json = dict[str, Any]
"""An object as the API returns it, in the fixture (which the setup passes change)."""

DEFAULT_NODES = 1000
GOAL_SECONDS = 0.5
TIMED_PASSES = 3
SETUP_PASSES = 12
"""At most this many passes to bring a scenario to its state (a rollout to its first drain)."""
NAMESPACE = "kmodkit-system"
SAMPLE_POLICY = Path(__file__).resolve().parents[2] / "docs/samples/clusterpolicy-ubuntu26.04.yaml"
CREATED = "2026-11-01T00:00:00Z"
SINCE = "1793491200"
"""When the converged nodes finished their last rollout (2026-11-01, Unix seconds)."""
POOL_LABEL = "tenstorrent.com/pool"
TELEMETRY_GATE = DEFAULT_DEPLOY_GATES[0]
INTEL_NODE_LABEL = "gpu.intel.com/exists"
BUILTIN_GROUPS = OFFLINE_API_GROUPS | {"", "coordination.k8s.io", "events.k8s.io"}
CRD_GROUPS = {
    "tenstorrentdriverpolicies.driver.tenstorrent.com": "driver.tenstorrent.com",
    "tenstorrentfirmwarepolicies.firmware.tenstorrent.com": "firmware.tenstorrent.com",
    "clusterpolicies.intel.com": "intel.com",
    "modules.kmodkit.io": "kmodkit.io",
    "nodefeaturerules.nfd.k8s-sigs.io": "nfd.k8s-sigs.io",
}

NODE_PATH = re.compile(r"/api/v1/nodes/([^/]+)")
EVENT_PATH = re.compile(r"/api/v1/namespaces/([^/]+)/events/([^/]+)")
JOB_PATH = re.compile(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)")
STATUS_PATH = re.compile(r"/apis/[^/]+/[^/]+/(namespaces/[^/]+/)?[^/]+/[^/]+/status")
_TERMS = re.compile(r",(?![^()]*\))")
_IN = re.compile(r"\s*([^\s=!(),]+)\s+in\s+\(([^()]*)\)\s*")
_EQUALS = re.compile(r"\s*([^\s=!(),]+)\s*==?\s*([^\s=!(),]*)\s*")


def merge_patch(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386, as the apiserver applies a merge patch: None removes, maps merge."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            inner = target.get(key)
            if not isinstance(inner, dict):
                inner = target[key] = {}
            merge_patch(inner, value)
        else:
            target[key] = copy.deepcopy(value)


def _labels(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether a label selector matches; only the forms the passes send are read."""
    for term in _TERMS.split(selector):
        if not term.strip():
            continue
        if found := _IN.fullmatch(term):
            if labels.get(found[1]) not in {v.strip() for v in found[2].split(",")}:
                return False
        elif found := _EQUALS.fullmatch(term):
            if labels.get(found[1]) != found[2]:
                return False
        else:
            raise NotImplementedError(f"the stand-in does not read the selector {term!r}")
    return True


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    body: Any


class StandInPool:
    """A stand-in for the API: records writes, sends none.

    Takes the place of an ApiClient's connection pool (a urllib3 ``PoolManager``): the client
    builds and parses every request as it would against an apiserver. Reads are answered from
    the fixture (``nodes``, and ``pods_on`` for the pods bound to a node); a write is recorded
    and answered with what it sent (a node patch with the node as the fixture holds it). The
    fixture changes only when the bench applies the recorded writes between passes
    (``Harness.settle``).
    """

    def __init__(self, nodes: dict[str, Json], pods_on: Callable[[str], list[Json]]) -> None:
        self.nodes = nodes
        self.pods_on = pods_on
        self.requests: list[Request] = []
        self.unanswered: list[str] = []
        self.connection_pool_kw: dict[str, Any] = {}
        """Sized by ``Throttle.install``, as on a PoolManager."""

    def clear(self) -> None:
        """A PoolManager drops its pools; the stand-in has none."""

    def request(self, method: str, url: str, body: str | None = None, **_: Any) -> Any:
        """What the REST client calls: one request, its answer (urllib3's response)."""
        parts = urlsplit(url)
        request = Request(
            method,
            parts.path,
            {k: v[0] for k, v in parse_qs(parts.query).items()},
            json.loads(body) if body else None,
        )
        self.requests.append(request)
        status, answer = self._answer(request)
        return urllib3.HTTPResponse(
            body=json.dumps(answer).encode(),
            status=status,
            headers={"Content-Type": "application/json"},
            preload_content=False,
        )

    def _answer(self, r: Request) -> tuple[int, Any]:
        if r.method == "GET":
            selector = r.query.get("labelSelector", "")
            if r.path == "/api/v1/nodes":
                nodes = [n for n in self.nodes.values() if selects(selector, _labels(n))]
                return 200, {"apiVersion": "v1", "kind": "NodeList", "items": nodes}
            if r.path == "/api/v1/pods":
                bound = r.query.get("fieldSelector", "").removeprefix("spec.nodeName=")
                pods = [p for p in self.pods_on(bound) if selects(selector, _labels(p))]
                return 200, {"apiVersion": "v1", "kind": "PodList", "items": pods}
            if JOB_PATH.fullmatch(r.path):
                return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound"}
            self.unanswered.append(f"GET {r.path}")
            return 500, {"kind": "Status", "status": "Failure", "message": "not in the stand-in"}
        if r.method == "PATCH" and (node := NODE_PATH.fullmatch(r.path)):
            return 200, self.nodes[node[1]]
        if r.method == "PATCH" and (event := EVENT_PATH.fullmatch(r.path)):
            meta = {"name": event[2], "namespace": event[1]}
            return 200, {"metadata": meta, "involvedObject": {}, **r.body}
        return (201 if r.method == "POST" else 200), r.body or {}

    @property
    def reads(self) -> int:
        return sum(1 for r in self.requests if r.method == "GET")

    @property
    def writes(self) -> int:
        return len(self.requests) - self.reads


class Applied:
    """A stand-in for the API: records writes, sends none.

    Takes the place of the dynamic client's resources, through which the runtime
    server-side applies every planned object and prunes those no longer planned.
    """

    def __init__(self) -> None:
        self.applied: list[Json] = []
        self.deleted: list[tuple[str, str]] = []

    def server_side_apply(self, body: Json, **_: Any) -> None:
        self.applied.append(copy.deepcopy(body))

    def delete(self, name: str, namespace: str | None = None, **_: Any) -> None:
        self.deleted.append((namespace or "", name))


class BenchController(ResourceController):
    """The runtime's controller, its server-side applies and prunes going to ``Applied``."""

    def __init__(self, backend: str, resource: Resource, shared: Shared, applied: Applied) -> None:
        super().__init__(backend, resource, shared)
        self.applied = applied

    def _resource_for(self, obj: Obj) -> Any:
        return self.applied


@dataclass
class Scenario:
    """One policy object and what the runtime hands its pass, kept as the cluster would."""

    body: dict[str, Any]
    watched: dict[str, list[Json]]
    owned: list[Json] = field(default_factory=list)
    live_status: Callable[[Json], dict[str, Any] | None] = lambda _: None
    """The status the cluster reports for an owned object once it exists."""


class Harness:
    """One backend resource's controller on a fleet fixture, with the API stood in."""

    def __init__(
        self,
        backend: str,
        resource: Resource,
        nodes: Sequence[Json],
        pods_on: Callable[[str], list[Json]] = lambda _: [],
    ) -> None:
        self.nodes = {str(n["metadata"]["name"]): n for n in nodes}
        self.pool = StandInPool(self.nodes, pods_on)
        api = client.ApiClient(client.Configuration(host="https://stand-in.invalid"))
        rest: Any = api.rest_client  # its pool is a urllib3 PoolManager; the stand-in acts one
        rest.pool_manager = self.pool
        shared = Shared(Kube(api, WriteSettings()), NAMESPACE)  # as run_operator builds it
        metrics.count_requests(api)
        shared.builtin_groups = BUILTIN_GROUPS
        shared.crd_groups = dict(CRD_GROUPS)
        shared.nodes_changed([Change(("", k), None, slim_node(n)) for k, n in self.nodes.items()])
        shared.nodes_synced = True
        self.shared = shared
        self.applied = Applied()
        self.controller = BenchController(backend, resource, shared, self.applied)
        self.watches = {w.name: w for w in resource.watches}

    def cached(self, name: str, objs: Iterable[Json]) -> list[Json]:
        """``objs`` as the runtime's cache for the watch ``name`` keeps them."""
        return [watched_view(self.watches[name], o) for o in objs]

    def run(self, s: Scenario) -> None:
        """One pass, as the kopf daemon's ``one_pass`` calls it."""
        self.controller.reconcile(
            dict(s.body), {name: list(objs) for name, objs in s.watched.items()}, list(s.owned)
        )

    def forget(self) -> None:
        self.pool.requests.clear()
        self.applied.applied.clear()
        self.applied.deleted.clear()

    def settle(self, s: Scenario) -> bool:
        """Apply the last pass's writes, as the apiserver and the watches would: node patches
        to the nodes and the node cache, the status to the object, applied objects to the
        owned ones. Whether the pass wrote the status."""
        changes = []
        wrote_status = False
        for r in self.pool.requests:
            if r.method != "PATCH":
                continue
            if node := NODE_PATH.fullmatch(r.path):
                obj = self.nodes[node[1]]
                patch = copy.deepcopy(r.body)
                patch["metadata"].pop("resourceVersion", None)
                merge_patch(obj, patch)
                meta = obj["metadata"]
                meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                changes.append(Change(("", node[1]), None, slim_node(obj)))
            elif STATUS_PATH.fullmatch(r.path):
                merge_patch(s.body, r.body)
                wrote_status = True
        if changes:
            self.shared.nodes_changed(changes)
        live = {_identity(o): o for o in s.owned}
        for body in self.applied.applied:
            key = _identity(body)
            old = live.get(key)
            new = copy.deepcopy(body)
            new["metadata"] = {**((old or {}).get("metadata") or {}), **body["metadata"]}
            new["metadata"].setdefault("uid", f"uid-{key[1].lower()}-{key[3]}")
            status = old.get("status") if old is not None else s.live_status(new)
            if status is not None:
                new["status"] = status
            live[key] = new
        s.owned = list(live.values())
        self.forget()
        return wrote_status

    def until_status_settles(self, s: Scenario) -> None:
        for _ in range(SETUP_PASSES):
            self.run(s)
            if not self.settle(s):
                return

    def measure(self, s: Scenario) -> tuple[float, dict[str, int]]:
        """The median CPU seconds of a pass, after a warm-up, and what the last one sent."""
        self.run(s)
        seconds = []
        for _ in range(TIMED_PASSES):
            self.forget()
            gc.collect()
            started = time.process_time()
            self.run(s)
            seconds.append(time.process_time() - started)
        if self.pool.unanswered:
            raise RuntimeError(f"the stand-in could not answer {sorted(set(self.pool.unanswered))}")
        sent = {
            "reads": self.pool.reads,
            "writes": self.pool.writes,
            "applies": len(self.applied.applied),
            "deletes": len(self.applied.deleted),
        }
        self.forget()
        return statistics.median(seconds), sent


def _node(name: str, index: int, labels: dict[str, str], annotations: dict[str, str]) -> Json:
    """A kwok node as the apiserver returns it, Ready."""
    node = node_manifest(name, KERNELS[index % len(KERNELS)], labels)
    meta = node["metadata"]
    meta.update(uid=f"uid-{name}", resourceVersion=str(1000 + index), creationTimestamp=CREATED)
    meta["annotations"].update(annotations)
    node["status"]["conditions"] = [
        {"type": kind, "status": "False", "reason": f"KubeletHas{ok}"}
        for kind, ok in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"))
    ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    return node


def _pod(
    name: str, namespace: str, node: str, owner: tuple[str, str], spec: Json, **meta: Any
) -> Json:
    """A pod bound and running (or, with ``phase``, finished) as the kubelet reports it."""
    phase = meta.pop("phase", "Running")
    done = phase != "Running"
    containers = spec.get("containers") or []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": CREATED,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1" if owner[0] == "Job" else "apps/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": f"uid-{owner[1]}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            **meta,
        },
        "spec": {**copy.deepcopy(spec), "nodeName": node},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "False" if done else "True"},
                {"type": "Ready", "status": "False" if done else "True"},
            ],
            "hostIP": "10.0.0.1",
            "podIP": "10.244.0.1",
            "startTime": CREATED,
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": not done,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}
                    if done
                    else {"running": {"startedAt": CREATED}},
                }
                for c in containers
            ],
        },
    }


def _workloads(node: str) -> list[Json]:
    """What else runs on a Tenstorrent node: an inference pod holding the device and the
    telemetry DaemonSet's pod (which the deploy gate takes off)."""
    consumer = {
        "containers": [
            {
                "name": "server",
                "image": "r.io/llm-server:1",
                "resources": {"limits": {"tenstorrent.com/n300": "1"}},
            }
        ]
    }
    telemetry = {"containers": [{"name": "telemetry", "image": "r.io/tt-telemetry:1"}]}
    return [
        _pod(f"llm-{node}", "inference", node, ("ReplicaSet", "llm-7d9f"), consumer),
        _pod(f"tt-telemetry-{node}", "monitoring", node, ("DaemonSet", "tt-telemetry"), telemetry),
    ]


# ---- Tenstorrent driver -----------------------------------------------------------------

DRIVER, FIRMWARE = tenstorrent.resources
DRIVER_ID = names.driver_policy_id("default")
FIRMWARE_ID = names.firmware_policy_id("default")


def _tt_nodes(n: int, kmd: str, readback: str) -> list[Json]:
    """Tenstorrent nodes where both policies have finished (driver ``kmd`` loaded, firmware
    ``readback`` flashed)."""
    driver, firmware = RolloutKeys.for_policy(DRIVER_ID), RolloutKeys.for_policy(FIRMWARE_ID)
    nodes = []
    for i in range(n):
        name = f"tt-{i:05d}"
        labels = {
            **TENSTORRENT_LABELS,
            POOL_LABEL: "inference",
            TELEMETRY_GATE: "true",
            tt.TT_INSTALL_MODE_LABEL: "container",
            tt.TT_KMD_VERSION_LABEL: kmd,
            tt.TT_SMI_VERSION_LABEL: "3.0.12",
            tt.TT_FW_VERSION_LABEL: readback,
            driver.state: "done",
            firmware.state: "done",
        }
        annotations = {
            driver.since: SINCE,
            driver.attempt: "1",
            firmware.since: SINCE,
            firmware.attempt: "1",
            tt.TT_FW_CURRENT_VERSION_ANNOTATION: readback,
            tt.TT_FW_LAST_JOB_ANNOTATION: names.flash_job_name("default", name, "19.9.0"),
        }
        nodes.append(_node(name, i, labels, annotations))
    return nodes


def _tt_policy(kind: str, version: str, generation: int, spec: dict[str, Any]) -> dict[str, Any]:
    group = {"TenstorrentDriverPolicy": DRIVER, "TenstorrentFirmwarePolicy": FIRMWARE}[kind]
    return {
        "apiVersion": group.api_version,
        "kind": kind,
        "metadata": {
            "name": "default",
            "uid": f"uid-{kind.lower()}",
            "generation": generation,
            "resourceVersion": "1",
            "creationTimestamp": CREATED,
        },
        "spec": {"version": version, **spec},
    }


def driver_policy(version: str, generation: int = 1) -> dict[str, Any]:
    """docs/tenstorrent.md's driver policy."""
    return _tt_policy(
        "TenstorrentDriverPolicy",
        version,
        generation,
        {
            "nodeAffinity": {"matchLabels": {POOL_LABEL: "inference"}},
            "paused": False,
            "upgradePolicy": {
                "drain": {
                    "enable": True,
                    "fullNode": True,
                    "podSelectorLabel": "",
                    "force": False,
                    "deleteEmptyDir": True,
                    "timeoutSeconds": 600,
                },
                "forceUnload": False,
                "haltOnFailure": True,
                "upgradeCordonedNodes": False,
                "upgradeTimeoutSeconds": 1800,
            },
            "installer": {"image": "", "imagePullPolicy": "IfNotPresent"},
        },
    )


def _daemonset_status(n: int) -> dict[str, Any]:
    return {
        "currentNumberScheduled": n,
        "desiredNumberScheduled": n,
        "numberAvailable": n,
        "numberMisscheduled": 0,
        "numberReady": n,
        "updatedNumberScheduled": n,
        "observedGeneration": 1,
    }


def _builder_pods(ds: Json, nodes: Sequence[Json]) -> dict[str, Json]:
    """The DaemonSet's pod on every node, Ready, from its current template."""
    template = ds["spec"]["template"]
    ds_name = ds["metadata"]["name"]
    pods = {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        pods[name] = _pod(
            f"{ds_name}-{name}",
            NAMESPACE,
            name,
            ("DaemonSet", ds_name),
            template["spec"],
            labels={**template["metadata"]["labels"], "pod-template-generation": "1"},
            annotations=dict(template["metadata"].get("annotations") or {}),
        )
    return pods


def measure_driver(n: int) -> dict[str, Any]:
    nodes = _tt_nodes(n, kmd="2.9.0", readback="19.9.0.0")
    builders: dict[str, Json] = {}
    h = Harness("tenstorrent", DRIVER, nodes, lambda node: [builders[node], *_workloads(node)])
    s = Scenario(
        driver_policy("2.9.0"),
        {BUILDERS: [], DRIVER_POLICIES: [], BUILDER_SETS: []},
        live_status=lambda obj: _daemonset_status(n) if obj["kind"] == "DaemonSet" else None,
    )
    s.watched[DRIVER_POLICIES] = [s.body]
    h.run(s)  # the policy's first pass makes its DaemonSet; the cluster runs it everywhere
    h.settle(s)
    (ds,) = [o for o in s.owned if o["kind"] == "DaemonSet"]
    builders.update(_builder_pods(ds, nodes))
    s.watched[BUILDERS] = h.cached(BUILDERS, builders.values())

    def builder_sets() -> None:
        s.watched[BUILDER_SETS] = [o for o in s.owned if o["kind"] == "DaemonSet"]

    builder_sets()
    h.until_status_settles(s)
    converged = h.measure(s)

    s.body = {**driver_policy("2.10.0", generation=2), "status": s.body.get("status")}
    s.watched[DRIVER_POLICIES] = [s.body]
    rolling = _roll(h, s, DRIVER_ID, after_each=builder_sets)
    return _figures(DRIVER, n, converged, rolling)


def _roll(
    h: Harness, s: Scenario, policy_id: str, after_each: Callable[[], None] = lambda: None
) -> tuple[float, dict[str, int]]:
    """Run the real passes after a version bump until a node is being drained, then time it."""
    state = RolloutKeys.for_policy(policy_id).state
    for _ in range(SETUP_PASSES):
        h.run(s)
        h.settle(s)
        after_each()
        if any(parse_state(_labels(n).get(state)) in NEEDS_PODS for n in h.nodes.values()):
            break
    else:
        raise RuntimeError(f"rollout {policy_id} did not reach a drain in {SETUP_PASSES} passes")
    h.until_status_settles(s)
    return h.measure(s)


# ---- Tenstorrent firmware ---------------------------------------------------------------


def firmware_policy(version: str, generation: int = 1) -> dict[str, Any]:
    """docs/tenstorrent.md's firmware policy (its empty ``readbackVersion`` and ``bundleURL``
    left out: the CRD reads them as unset)."""
    return _tt_policy(
        "TenstorrentFirmwarePolicy",
        version,
        generation,
        {
            "nodeAffinity": {},
            "paused": False,
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallel": 1,
                "flashTimeoutSeconds": 900,
                "haltOnFailure": True,
                "upgradeCordonedNodes": False,
                "drain": {
                    "enable": True,
                    "force": False,
                    "deleteEmptyDir": True,
                    "timeoutSeconds": 600,
                },
            },
            "flasher": {
                "image": "",
                "imagePullPolicy": "IfNotPresent",
                "forceWrite": False,
                "continueOnReadbackFailure": False,
                "homogenizeFirmwareVersions": False,
                "podLabels": {},
            },
        },
    )


def _flash_pods(body: Json, nodes: Sequence[Json]) -> list[Json]:
    """The last rollout's flash pods, finished (their Jobs live a day after)."""
    spec = TenstorrentFirmwarePolicySpec.model_validate(body["spec"])
    settings = TenstorrentSettings()
    pods = []
    for node in nodes:
        name = str(node["metadata"]["name"])
        job = flash_job(body, name, f"1@{spec.version}", NAMESPACE, spec, settings)
        template = job["spec"]["template"]
        job_name = job["metadata"]["name"]
        pods.append(
            _pod(
                f"{job_name}-x7k2p",
                NAMESPACE,
                name,
                ("Job", job_name),
                template["spec"],
                labels={**template["metadata"]["labels"], "job-name": job_name},
                phase="Succeeded",
            )
        )
    return pods


def measure_firmware(n: int) -> dict[str, Any]:
    nodes = _tt_nodes(n, kmd="2.9.0", readback="19.9.0.0")
    h = Harness("tenstorrent", FIRMWARE, nodes, _workloads)
    body = firmware_policy("19.9.0")
    s = Scenario(
        body, {FLASHERS: h.cached(FLASHERS, _flash_pods(body, nodes)), FIRMWARE_POLICIES: [body]}
    )
    h.until_status_settles(s)
    converged = h.measure(s)

    s.body = {**firmware_policy("19.10.0", generation=2), "status": s.body.get("status")}
    s.watched[FIRMWARE_POLICIES] = [s.body]
    rolling = _roll(h, s, FIRMWARE_ID)
    return _figures(FIRMWARE, n, converged, rolling)


# ---- Intel ClusterPolicy ----------------------------------------------------------------


def cluster_policy(version: str, generation: int = 1) -> dict[str, Any]:
    """docs/samples' ClusterPolicy, with ordered upgrades (its kernelModule ``version``)."""
    body: dict[str, Any] = yaml.safe_load(SAMPLE_POLICY.read_text())
    body["metadata"].update(
        uid="uid-clusterpolicy",
        generation=generation,
        resourceVersion="1",
        creationTimestamp=CREATED,
    )
    body["spec"]["kernelModule"]["version"] = version
    return body


def _claims(nodes: Sequence[Json]) -> list[Json]:
    """One allocated GPU ResourceClaim per node: every node runs a GPU workload."""
    claims = []
    for node in nodes:
        name = str(node["metadata"]["name"])
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"gpu-{name}", "namespace": "inference", "uid": f"c-{name}"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": "gpu.intel.com",
                                    "pool": name,
                                    "device": "card0",
                                }
                            ]
                        }
                    },
                    "reservedFor": [{"resource": "pods", "name": f"llm-{name}", "uid": "p"}],
                },
            }
        )
    return claims


def _intel_status(n: int, loaded: int) -> Callable[[Json], dict[str, Any] | None]:
    def status(obj: Json) -> dict[str, Any] | None:
        if obj["kind"] == "DaemonSet":
            return _daemonset_status(n)
        if obj["kind"] == "Module":
            return {
                "moduleLoader": {
                    "availableNumber": loaded,
                    "desiredNumber": n,
                    "nodesMatchingSelectorNumber": n,
                }
            }
        return None

    return status


def measure_cluster_policy(n: int) -> dict[str, Any]:
    labels = {**INTEL_GPU_LABELS, INTEL_NODE_LABEL: "true"}
    nodes = [_node(f"xe-{i:05d}", i, dict(labels), {}) for i in range(n)]
    h = Harness("intel_xe", CLUSTER_POLICY, nodes)
    namespaces = [{"metadata": {"name": NAMESPACE, "labels": {ADMIN_ACCESS_LABEL: "true"}}}]
    s = Scenario(
        cluster_policy("v7.1.4.8_260728.8"),
        {CLAIMS.name: h.cached(CLAIMS.name, _claims(nodes)), ADMIN_NAMESPACES.name: namespaces},
        live_status=_intel_status(n, n),
    )
    h.until_status_settles(s)
    converged = h.measure(s)

    s.body = {**cluster_policy("v7.1.5.1_261002.3", generation=2), "status": s.body.get("status")}
    for obj in s.owned:
        if obj["kind"] == "Module":
            obj["status"] = _intel_status(n, n // 2)(obj)
    h.until_status_settles(s)
    rolling = h.measure(s)
    return _figures(CLUSTER_POLICY, n, converged, rolling)


def _figures(
    resource: Resource,
    n: int,
    converged: tuple[float, dict[str, int]],
    rolling: tuple[float, dict[str, int]],
) -> dict[str, Any]:
    return {
        "bench": "pass",
        "resource": resource.crd.plural,
        "nodes": n,
        "cpu_seconds": round(converged[0], 3),
        "rolling_cpu_seconds": round(rolling[0], 3),
        "goal_seconds": GOAL_SECONDS,
        "requests": {"converged": converged[1], "rolling": rolling[1]},
    }


def measure(n: int) -> Iterator[dict[str, Any]]:
    """The figures of each backend resource, one after the other."""
    for one in (measure_driver, measure_firmware, measure_cluster_policy):
        yield one(n)
        gc.collect()


def main() -> None:
    from tests.bench.run import emit

    for figures in measure(int(os.environ.get("BENCH_PASS_NODES", str(DEFAULT_NODES)))):
        emit(**figures)


if __name__ == "__main__":
    main()
