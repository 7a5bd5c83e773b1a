"""The module-loader plan over many passes: a stateful property test.

Hypothesis drives a simulated cluster through arbitrary interleavings of
operator passes, passes killed part-way (only a prefix of their writes lands, in
the order the controller makes them: every pod creation, then the deletions
node by node, a node's skipped when its creation was refused, then one label
patch per node in name order), refused writes, kubelet events (loader pods
starting, turning Ready or not, crash-looping, ended by the kubelet, their
deletion finishing; unloader pods succeeding, failing, ended), reboots (maybe
into another kernel, one without a mapping among them), nodes NotReady, pods
gated on the readiness label arriving and leaving, and admin changes: the
Module's image, parameters or version (an Update), its tolerations or the
operator's agent image (a Refresh), its selector, its budget, node labels and
taints, and the Module's deletion. A pass may plan on a node list with nodes
missing (a cache still filling). The world changes between passes; a pass
reads it once.

The simulated apiserver, kubelet and kernel are stand-ins: pods are the dicts
the plan asks for, read back with ``loader_pod_view``; a creation whose name
exists is taken as done (as ``Kube.create`` takes a 409); a loader pod that
turns Ready has loaded its module, an unloader that succeeds (only once no
loader pod runs on its node, as the agents' host lock has it) has unloaded it,
and an old pod that unloads on SIGTERM unloads as it goes. What is under test
is the plan's decisions (``plan``, and ``plan(removing=True)`` as ``finalize``
calls it).

Safety, checked at every write: no node whose wanted module did not change
(still selected, the same mapping and version, or held back by its version
label with a pod on its kernel) is unloaded (an unloader made, an old pod that
unloads on SIGTERM deleted, its last recording pod deleted); a node whose pods
say something may be loaded always keeps one; no pod or label of a node missing
from the pass's node list is touched; a write that takes a node out of service
(nothing ready loaded on its kernel, a pod renewed, an update under way: the
label gone while an outdated module serves and its image exists) keeps the
number of such nodes within maxUnavailable; the ready label is removed only from
a node where no pod of the wanted module serves, and set only where one does;
an unloader, or a new module replacing a serving one, comes only once no pod
gated on the label is left on the node. Liveness, at the end: once the world
behaves (nodes Ready and listed, images pushed, pods start, unloaders succeed,
gated pods leave unlabelled nodes), a bounded number of passes leaves every
selected node with exactly one Ready loader pod of the current spec and its
labels, every other node unloaded, unlabelled and without pods.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)

from kmodkit.core import labels
from kmodkit.core.api import Module
from kmodkit.core.engine import loader_plan
from kmodkit.core.engine.kernel_mapping import NoMatch, ResolvedMapping, resolve
from kmodkit.core.engine.loader_plan import (
    ImageState,
    ImageStatus,
    LoaderPlan,
    Phase,
    plan,
)
from kmodkit.core.engine.loader_pod import (
    AGENT_CONFIG,
    COMPONENT_LABEL,
    CONFIG_HASH,
    MODULE_HASH,
    UNLOADER_COMPONENT,
    LoaderPod,
    LoaderSettings,
    for_node,
    loader_pod_view,
    pod_template,
)
from kmodkit.core.nodes import NodeView, Taint, relabelled

NS, NAME = "drivers", "xe"
READY = labels.READY.key(NS, NAME)
VREADY = labels.VERSION_READY.key(NS, NAME)
WANT = labels.MODULE_VERSION.key(NS, NAME)
K1, K2, K3 = "6.8.0-45-generic", "7.0.0-14-generic", "5.14.0-427.el9.x86_64"
MAPPED = (K1, K2)
"""K3 has no kernel mapping: a node booted into it is not the Module's."""
TAINT = Taint("dedicated", "ml", "NoSchedule")


@dataclass(frozen=True)
class Spec:
    """What the admin asks of the Module (and of the operator: its agent image)."""

    image: str = "a"
    parameters: tuple[str, ...] = ()
    version: str = ""
    tolerate: bool = False
    """Tolerate TAINT: a new pod for every node (a Refresh), and tainted nodes join."""
    pool: str | None = None
    """Select only nodes of this pool besides gpu=intel."""
    max_unavailable: int | str = 1
    agent: str = "1"

    def selects(self, node: SimNode) -> bool:
        if node.labels.get("gpu") != "intel":
            return False
        if self.pool is not None and node.labels.get("pool") != self.pool:
            return False
        return self.tolerate or TAINT not in node.taints


@functools.cache
def module_of(spec: Spec) -> Module:
    modprobe: dict[str, Any] = {"moduleName": "xe"}
    if spec.parameters:
        modprobe["parameters"] = list(spec.parameters)
    image = f"r.io/xe-{spec.image}:${{KERNEL_FULL_VERSION}}"
    container: dict[str, Any] = {
        "modprobe": modprobe,
        "kernelMappings": [
            {"regexp": r"^6\.8\.", "containerImage": image},
            {"literal": K2, "containerImage": image},
        ],
    }
    if spec.version:
        container["version"] = spec.version
    body: dict[str, Any] = {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "selector": {"gpu": "intel", **({"pool": spec.pool} if spec.pool else {})},
            "moduleLoader": {"container": container},
            "rollout": {"maxUnavailable": spec.max_unavailable},
        },
    }
    if spec.tolerate:
        body["spec"]["tolerations"] = [{"key": TAINT.key, "operator": "Exists"}]
    return Module.model_validate(body)


@functools.cache
def loader_settings(agent: str) -> LoaderSettings:
    return LoaderSettings(agent_image=f"registry.example.com/kmodkit/agent:{agent}")


@functools.cache
def template(spec: Spec, kernel: str) -> dict[str, Any]:
    """The loader pod template for ``kernel`` (a mapped one), as the plan makes it."""
    m = module_of(spec)
    resolved = resolve(m, kernel)
    assert not isinstance(resolved, NoMatch)
    return pod_template(m, resolved, loader_settings(spec.agent))


_TEMPLATES: dict[tuple[int, str, LoaderSettings], tuple[Module, dict[str, Any]]] = {}


def kept_template(
    module: Module, resolved: ResolvedMapping, settings: LoaderSettings
) -> dict[str, Any]:
    """``pod_template``, kept across passes (a plan keeps it for one pass): it is a pure
    function of the Module, the kernel and the settings, and most of a pass's time."""
    key = (id(module), resolved.kernel, settings)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = (module, pod_template(module, resolved, settings))
    return _TEMPLATES[key][1]


def wanted_hash(spec: Spec, kernel: str) -> str:
    return str(template(spec, kernel)["metadata"]["annotations"][MODULE_HASH])


def wanted_config(spec: Spec, kernel: str) -> str:
    return str(template(spec, kernel)["metadata"]["annotations"][CONFIG_HASH])


def image_of(spec: Spec, kernel: str) -> str:
    return f"r.io/xe-{spec.image}:{kernel}"


def timestamp(second: int) -> str:
    """A creationTimestamp: RFC 3339, whole seconds (pods made within one second tie)."""
    return f"2025-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"


@dataclass
class SimNode:
    name: str
    kernel: str
    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    """The kubelet runs (a NotReady node's pods neither start, stop nor go away)."""
    loaded: str | None = None
    """The module hash the kernel has loaded (None: nothing of the Module)."""
    consumers: list[str] = field(default_factory=list)
    """Pods gated on the ready label (a device plugin's), as ``namespace/name``."""

    def view(self) -> NodeView:
        return NodeView(
            name=self.name,
            labels=dict(self.labels),
            kernel=self.kernel,
            arch="amd64",
            ready=self.ready,
            taints=self.taints,
            uid=f"uid-{self.name}",
        )


@dataclass
class SimPod:
    """A pod as the apiserver holds it, and as the operator's cache reads it."""

    raw: dict[str, Any]
    view: LoaderPod = field(init=False)

    def __post_init__(self) -> None:
        self.view = loader_pod_view(self.raw)

    def changed(self) -> None:
        """Read again what changes after creation: the status, the deletion. (The rest is
        read once: an old pod's module is read from its YAML, which takes a while.)"""
        meta: dict[str, Any] = {"annotations": {MODULE_HASH: "-"}}  # no module to read
        if "deletionTimestamp" in self.raw["metadata"]:
            meta["deletionTimestamp"] = self.raw["metadata"]["deletionTimestamp"]
        now = loader_pod_view({"metadata": meta, "status": self.raw["status"]})
        self.view = replace(self.view, **{f: getattr(now, f) for f in _CHANGING})

    @property
    def node(self) -> str:
        return str(self.raw["spec"]["nodeName"])

    @property
    def running(self) -> bool:
        """Its containers run, or will (being deleted, too, until the kubelet is done)."""
        return not self.view.ended

    def set_status(self, phase: str, ready: bool = False, crashing: bool = False) -> None:
        restarts = self.view.restarts + (1 if crashing else 0)
        status: dict[str, Any] = {"phase": phase}
        if phase == "Running":
            status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        if restarts:
            state: dict[str, Any] = (
                {"waiting": {"reason": "CrashLoopBackOff"}} if crashing else {"running": {}}
            )
            status["containerStatuses"] = [
                {
                    "name": "agent",
                    "restartCount": restarts,
                    "state": state,
                    "lastState": {"terminated": {"exitCode": 3, "message": "held by pid 4242"}},
                }
            ]
        self.raw["status"] = status
        self.changed()


_CHANGING = ("ready", "deleting", "problem", "phase", "restarts")
"""The fields of a pod's view that its status and deletion make."""


class Violation(AssertionError):
    pass


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise Violation(message)


class LoaderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[str, SimPod] = {}
        self.spec = Spec()
        self.removing = False
        self.images: set[str] = set()
        self.clock = 0
        self.uids = 0
        self.pass_count = 0
        self.listed: set[str] = set()
        """The nodes the pass under way was shown."""

    # -- the fleet --------------------------------------------------------------

    @initialize(
        count=st.integers(2, 6),
        budget=st.one_of(st.integers(1, 3), st.sampled_from(["34%", "50%"])),
        version=st.sampled_from(["", "v1"]),
        shapes=st.lists(
            st.tuples(
                st.sampled_from([K1, K1, K2, K2, K1, K3]),
                st.sampled_from(["intel", "intel", "intel", "amd"]),
                st.sampled_from(["loaded", "loaded", "legacy", "empty"]),
                st.booleans(),  # pool a or b
            ),
            min_size=6,
            max_size=6,
        ),
    )
    def fleet(
        self,
        count: int,
        budget: int | str,
        version: str,
        shapes: list[tuple[str, str, str, bool]],
    ) -> None:
        self.spec = Spec(version=version, max_unavailable=budget)
        self.images = {image_of(self.spec, k) for k in MAPPED}
        for i in range(count):
            kernel, gpu, state, pool = shapes[i]
            node_labels = {"gpu": gpu, "pool": "a" if pool else "b"}
            if version:
                node_labels[WANT] = version
            sim = SimNode(f"n{i}", kernel, node_labels)
            self.nodes[sim.name] = sim
            if state != "empty" and kernel in MAPPED:
                self._seed_pod(sim, legacy=state == "legacy")
        # Under budget, so that updates really start: a node with nothing loaded
        # counts against it, so at most budget - 1 such nodes.
        limit = self._limit()
        for sim in self.nodes.values():
            if self._targeted(sim) and self._disrupted(sim):
                if limit > 1:
                    limit -= 1
                else:
                    self._seed_pod(sim, legacy=False)

    def _seed_pod(self, sim: SimNode, legacy: bool) -> None:
        """A Ready loader pod of the first spec, loaded and labelled."""
        body = json.loads(
            json.dumps(for_node(template(self.spec, sim.kernel), module_of(self.spec), sim.view()))
        )
        if legacy:
            # Made before pods recorded their module: it unloads on SIGTERM.
            ann = body["metadata"]["annotations"]
            del ann[MODULE_HASH]
            ann[AGENT_CONFIG] = ann[AGENT_CONFIG].replace(
                "unloadOnTerminate: false", "unloadOnTerminate: true"
            )
            ann[CONFIG_HASH] = "from-an-older-operator"
        pod = self._make(body)
        pod.set_status("Running", ready=True)
        assert pod.view.leaves_loaded is not legacy
        assert pod.view.module_hash == wanted_hash(self.spec, sim.kernel)
        sim.loaded = pod.view.module_hash
        sim.labels[READY] = ""
        sim.consumers.append(f"kube-system/dp-{sim.name}")  # a device plugin uses it
        if self.spec.version:
            sim.labels[VREADY] = self.spec.version

    def _make(self, body: dict[str, Any]) -> SimPod:
        self.uids += 1
        body["metadata"]["uid"] = f"uid-{self.uids}"
        body["metadata"]["creationTimestamp"] = timestamp(self.clock)
        body["status"] = {"phase": "Pending"}
        pod = SimPod(body)
        self.pods[pod.view.name] = pod
        return pod

    def _node(self, data: st.DataObject) -> SimNode:
        return self.nodes[data.draw(st.sampled_from(sorted(self.nodes)), label="node")]

    def _pod(self, data: st.DataObject) -> SimPod | None:
        if not self.pods:
            return None
        return self.pods[data.draw(st.sampled_from(sorted(self.pods)), label="pod")]

    # -- what the world says ------------------------------------------------------

    def _on(self, node: str) -> list[SimPod]:
        return [p for p in self.pods.values() if p.node == node]

    def _live(self, node: str) -> list[SimPod]:
        """Loader pods that run (or will): neither deleted nor ended."""
        return [
            p
            for p in self._on(node)
            if not p.view.unloader and not p.view.deleting and not p.view.ended
        ]

    def _unloader(self, node: str) -> SimPod | None:
        return next((p for p in self._on(node) if p.view.unloader and not p.view.deleting), None)

    def _selected(self, sim: SimNode) -> bool:
        return not self.removing and self.spec.selects(sim) and sim.kernel in MAPPED

    def _held_back(self, sim: SimNode) -> bool:
        """The Module names a version the node is not labelled for (and no pod runs)."""
        version = self.spec.version
        return (
            bool(version)
            and sim.labels.get(WANT) != version
            and all(p.view.version != version for p in self._live(sim.name))
        )

    def _targeted(self, sim: SimNode) -> bool:
        """A node the Module should run its current spec on (the budget's nodes)."""
        return self._selected(sim) and not self._held_back(sim)

    def _unchanged(self, sim: SimNode) -> bool:
        """The node's wanted module did not change: it must keep what it has loaded."""
        if not self._selected(sim):
            return False
        live = self._live(sim.name)
        if self._held_back(sim):
            return any(p.view.kernel == sim.kernel for p in live)
        want = wanted_hash(self.spec, sim.kernel)
        recorded = [p for p in self._on(sim.name) if not p.view.unloader and not p.view.deleting]
        return sim.loaded == want or any(
            p.view.module_hash == want and p.view.kernel == sim.kernel for p in recorded
        )

    def _serving(self, sim: SimNode) -> bool:
        """A pod of the module the node should run serves it: the ready label must stay."""
        if not self._selected(sim):
            return False
        ready = [p for p in self._live(sim.name) if p.view.ready and p.view.kernel == sim.kernel]
        if self._held_back(sim):
            return bool(ready)
        want = wanted_hash(self.spec, sim.kernel)
        return any(p.view.module_hash == want for p in ready)

    def _serves_wanted(self, sim: SimNode, pod: SimPod) -> bool:
        """``pod`` is a Ready loader pod of the module the node should run, on its kernel."""
        return (
            self._selected(sim)
            and not self._held_back(sim)
            and not pod.view.unloader
            and not pod.view.deleting
            and pod.view.ready
            and pod.view.kernel == sim.kernel
            and pod.view.module_hash == wanted_hash(self.spec, sim.kernel)
        )

    def _disrupted(self, sim: SimNode) -> bool:
        """Out of service, for the budget: nothing ready loaded on its kernel, an unload
        under way, a pod being renewed, or an update under way (the label gone while an
        outdated module serves, and the new module's image exists)."""
        if self._unloader(sim.name) is not None:
            return True
        live = self._live(sim.name)
        ready = [p for p in live if p.view.ready and p.view.kernel == sim.kernel]
        if not ready:
            return True
        hashes = [p.view.module_hash for p in live]
        if len(hashes) != len(set(hashes)):
            return True  # a Refresh: a new pod takes over the loaded module
        want = wanted_hash(self.spec, sim.kernel)
        return (
            READY not in sim.labels
            and all(p.view.module_hash != want for p in ready)
            and image_of(self.spec, sim.kernel) in self.images
        )

    def _limit(self, listed: set[str] | None = None) -> int:
        """maxUnavailable as a node count: a percentage of the (listed) selected nodes."""
        base = sum(
            1
            for s in self.nodes.values()
            if self.spec.selects(s) and (listed is None or s.name in listed)
        )
        value = self.spec.max_unavailable
        if isinstance(value, int):
            return value
        return max(1, base * int(value.rstrip("%")) // 100)  # rounds down, never below one

    def _needs_record(self, node: str) -> bool:
        """Its pods say something of the Module may be loaded there (an unloader that
        succeeded says nothing is, even while it is being deleted)."""
        pods = self._on(node)
        if any(p.view.unloader and p.view.phase == "Succeeded" for p in pods):
            return False
        return any(not p.view.deleting for p in pods)

    def _has_record(self, node: str) -> bool:
        return any(
            not p.view.deleting or (not p.view.leaves_loaded and not p.view.unloader)
            for p in self._on(node)
        )

    # -- the operator -----------------------------------------------------------

    def _plan(self, listed: list[NodeView]) -> LoaderPlan:
        """As ``reconcile`` (or ``finalize``): plan, list the gated pods of the nodes the
        plan asks about, and plan again with them."""
        m = module_of(self.spec)
        pods = [p.view for p in self.pods.values()]
        images = {i: ImageStatus(ImageState.EXISTS) for i in self.images}
        settings_ = loader_settings(self.spec.agent)
        with mock.patch.object(loader_plan, "pod_template", kept_template):
            p = plan(m, listed, pods, images, settings_, removing=self.removing)
            if p.awaiting_consumers:
                consumers = {n: list(self.nodes[n].consumers) for n in p.awaiting_consumers}
                p = plan(m, listed, pods, images, settings_, consumers, removing=self.removing)
        return p

    @rule(
        kill_at=st.one_of(st.none(), st.integers(0, 8)),
        refuse_at=st.one_of(st.none(), st.none(), st.integers(0, 8)),
        hide=st.one_of(st.just(frozenset()), st.frozensets(st.integers(0, 5), max_size=2)),
    )
    def operator_pass(
        self, kill_at: int | None, refuse_at: int | None, hide: frozenset[int]
    ) -> None:
        """One pass, killed after ``kill_at`` writes, the write ``refuse_at`` refused, on a
        node list without the nodes ``hide``."""
        self._pass(kill_at, refuse_at, {f"n{i}" for i in hide})

    @rule(count=st.integers(1, 3))
    def passes(self, count: int) -> None:
        """Passes that run to their end on the whole node list."""
        for _ in range(count):
            self._pass()

    def _pass(
        self,
        kill_at: int | None = None,
        refuse_at: int | None = None,
        hidden: set[str] | None = None,
    ) -> int:
        """One pass, as the controller applies it; how many writes it attempted."""
        self.pass_count += 1
        hidden = hidden or set()
        listed = [s.view() for s in self.nodes.values() if s.name not in hidden]
        names = self.listed = {v.name for v in listed}
        p = self._plan(listed)
        serving = {n for n, s in self.nodes.items() if self._serving(s)}
        has_ready = {
            n
            for n, s in self.nodes.items()
            if any(x.view.ready and x.view.kernel == s.kernel for x in self._live(n))
        }
        writes = 0
        refused: set[str] = set()

        def attempt(node: str) -> bool | None:
            """Whether the next write goes through; None: the operator died before it."""
            nonlocal writes
            if writes == kill_at:
                return None
            _check(node in names, f"a write to {node}, missing from the node list")
            writes += 1
            return writes - 1 != refuse_at

        # The labels first, one patch per node in name order (_label_nodes); when a ready
        # label went, reconcile plans again with the labels as written (the gated pods read
        # anew); then the creations, then deletions by node (none for a node whose creation
        # was refused): _apply_pods.
        landed = {}
        for node, change in sorted(p.node_labels.items()):
            go = attempt(node)
            if go is None:
                return writes
            if go:
                self._label(self.nodes[node], change, node in serving, node in has_ready)
                landed[node] = change
        if not self.removing and any(c.get(READY, "") is None for c in landed.values()):
            p = self._plan(relabelled(listed, landed))
        for body in p.create:
            node = body["spec"]["nodeName"]
            go = attempt(node)
            if go is None:
                return writes
            if not go:
                refused.add(node)
                continue
            self._watched(node, functools.partial(self._create, body))
        for node, pod_names in p.deletes_by_node.items():
            for pod_name in pod_names if node not in refused else ():
                go = attempt(node)
                if go is None:
                    return writes
                if go:
                    pod = self.pods.get(pod_name)
                    _check(pod is None or pod.node in names, f"{pod_name}: on a missing node")
                    self._watched(node, functools.partial(self._delete, pod_name))
        return writes

    def _watched(self, node: str, write: Callable[[], None]) -> None:
        """A pod write on ``node``, with the properties that hold across it."""
        sim = self.nodes[node]
        needs_record = self._needs_record(node)
        was_disrupted = self._disrupted(sim)
        write()
        if needs_record:
            _check(self._has_record(node), f"{node}: no pod left recording what it runs")
        if self._targeted(sim) and not was_disrupted and self._disrupted(sim):
            self._check_budget(node)

    def _create(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        sim = self.nodes[body["spec"]["nodeName"]]
        if name in self.pods:
            return  # 409: Kube.create takes it as made
        unloader = body["metadata"]["labels"][COMPONENT_LABEL] == UNLOADER_COMPONENT
        module_hash = body["metadata"]["annotations"].get(MODULE_HASH)
        ready = [p for p in self._live(sim.name) if p.view.ready and p.view.kernel == sim.kernel]
        if unloader:
            if self._unloader(sim.name) is None:
                _check(not self._unchanged(sim), f"{sim.name}: unloaded, its module unchanged")
                _check(not sim.consumers, f"{sim.name}: unloaded under {sim.consumers}")
        elif ready and all(p.view.module_hash != module_hash for p in ready):
            # The new pod swaps the serving module for another.
            _check(not sim.consumers, f"{sim.name}: module replaced under {sim.consumers}")
        self._make(json.loads(json.dumps(body)))

    def _delete(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is None or pod.view.deleting:
            return  # 404, or already going
        sim = self.nodes[pod.node]
        # An unload decided earlier finishes even if the node is wanted again meanwhile:
        # its unloader may have begun, and only its end says what is loaded.
        if self._serves_wanted(sim, pod) and self._unloader(sim.name) is None:
            others = [
                q for q in self._live(sim.name) if q is not pod and self._serves_wanted(sim, q)
            ]
            _check(
                bool(others), f"{sim.name}: {name} deleted while it alone serves the wanted module"
            )
        if not pod.view.unloader and not pod.view.leaves_loaded and pod.running:
            # It unloads on SIGTERM (an unload under way, an unloader there, is one begun
            # earlier); one that serves must first see its gated pods leave.
            if self._unloader(sim.name) is None:
                _check(not self._unchanged(sim), f"{sim.name}: {name} unloads, module unchanged")
            if pod.view.ready:
                _check(not sim.consumers, f"{sim.name}: {name} unloads under {sim.consumers}")
        pod.raw["metadata"]["deletionTimestamp"] = timestamp(self.clock)
        pod.changed()

    def _label(
        self, sim: SimNode, change: dict[str, str | None], serving: bool, has_ready: bool
    ) -> None:
        was_disrupted = self._disrupted(sim)
        if READY in change:
            if change[READY] is None:
                _check(not serving, f"{sim.name}: ready label removed, its module serving")
            else:
                _check(has_ready, f"{sim.name}: labelled ready with nothing ready loaded")
        for key, value in change.items():
            if value is None:
                sim.labels.pop(key, None)
            else:
                sim.labels[key] = value
        if self._targeted(sim) and not was_disrupted and self._disrupted(sim):
            self._check_budget(sim.name)

    def _check_budget(self, node: str) -> None:
        """Over the nodes the pass was shown: a node missing from the list is one the
        controller holds deleted (it plans only on a full listing), and whatever it
        runs is no longer the fleet's."""
        out = sorted(
            s.name
            for s in self.nodes.values()
            if s.name in self.listed and self._targeted(s) and self._disrupted(s)
        )
        limit = self._limit(self.listed)
        _check(len(out) <= limit, f"{node}: out of service {out}, maxUnavailable {limit}")

    # -- the kubelet and the kernel ------------------------------------------------

    @rule(data=st.data())
    def kubelet(self, data: st.DataObject) -> None:
        """Something happens to one pod: what can happen to a pod of its kind and phase."""
        pod = self._pod(data)
        if pod is None or not self.nodes[pod.node].ready:
            return  # a NotReady node's pods neither start, stop nor go away
        sim = self.nodes[pod.node]
        if pod.view.deleting:
            self._gone(pod)
            return
        if pod.view.ended:
            return
        if pod.view.unloader:
            event = data.draw(st.sampled_from(["succeed", "crash", "end"]), label="unloader")
        else:
            event = data.draw(st.sampled_from(["start", "unready", "crash", "end"]), label="loader")
        if event == "succeed":
            self._unload(pod)
        elif event == "start":
            self._start(pod, sim)
        elif event == "unready":
            if pod.view.phase == "Running":
                pod.set_status("Running", ready=False)
        elif event == "crash":
            pod.set_status("Running", crashing=True)
        else:
            pod.set_status("Failed")  # evicted, refused at admission, shut down

    def _start(self, pod: SimPod, sim: SimNode) -> bool:
        """The agent loads the pod's module, if it can: its kernel is the node's, no other
        module is kept loaded by a pod that runs, no old pod unloads as it leaves."""
        if pod.view.ready:
            return False
        others = [p for p in self._on(sim.name) if p is not pod and p.running]
        if (
            pod.view.kernel != sim.kernel
            or any(p.view.unloader for p in others)
            or any(p.view.module_hash != pod.view.module_hash for p in self._live(sim.name))
            or any(not p.view.leaves_loaded and p.view.deleting for p in others)
        ):
            if pod.view.phase != "Running":
                pod.set_status("Running", crashing=pod.view.kernel != sim.kernel)
            return False
        pod.set_status("Running", ready=True)
        sim.loaded = pod.view.module_hash
        return True

    def _unload(self, pod: SimPod) -> bool:
        """Only once no loader pod runs on the node (the agents' host lock)."""
        sim = self.nodes[pod.node]
        if any(p.running and not p.view.unloader for p in self._on(sim.name)):
            return False
        pod.set_status("Succeeded")
        sim.loaded = None
        return True

    def _gone(self, pod: SimPod) -> None:
        if not pod.view.unloader and not pod.view.leaves_loaded and pod.running:
            self.nodes[pod.node].loaded = None  # it unloaded on SIGTERM
        del self.pods[pod.view.name]

    @rule(
        data=st.data(),
        event=st.sampled_from(["reboot", "reboot", K1, K2, "NotReady", "Ready", "Ready", K3]),
    )
    def node_event(self, data: st.DataObject, event: str) -> None:
        """A node restarts (maybe into another kernel: nothing is loaded, its pods'
        containers start again, pods being deleted are gone) or changes readiness."""
        sim = self._node(data)
        if event in ("NotReady", "Ready"):
            sim.ready = event == "Ready"
            return
        sim.kernel = sim.kernel if event == "reboot" else event
        sim.loaded = None
        for pod in self._on(sim.name):
            if pod.view.deleting:
                del self.pods[pod.view.name]
            elif pod.running:
                pod.set_status("Pending")

    @rule(data=st.data(), arrives=st.booleans())
    def consumers(self, data: st.DataObject, arrives: bool) -> None:
        """A pod gated on the ready label is scheduled (only where the label is), or the
        node's gated pods leave."""
        sim = self._node(data)
        if not arrives:
            sim.consumers = []
        elif READY in sim.labels:
            sim.consumers.append(f"kube-system/dp-{sim.name}-{len(sim.consumers)}")

    # -- the admin --------------------------------------------------------------

    @precondition(lambda self: not self.removing)
    @rule(
        change=st.sampled_from(
            # Updates (three kinds), refreshes (two), the nodes selected, the budget.
            [
                *("parameters", "image", "parameters", "version"),
                *("agent", "agent", "tolerate"),
                *("pool", "budget"),
            ]
        ),
        budget=st.one_of(st.integers(1, 3), st.sampled_from(["34%", "50%"])),
    )
    def spec_changes(self, change: str, budget: int | str) -> None:
        s = self.spec
        if change == "image":
            self.spec = replace(s, image="b" if s.image == "a" else "a")
        elif change == "parameters":
            self.spec = replace(s, parameters=() if s.parameters else ("debug=1",))
        elif change == "version":
            self.spec = replace(s, version={"": "v1", "v1": "v2", "v2": "v1"}[s.version])
        elif change == "tolerate":
            self.spec = replace(s, tolerate=not s.tolerate)
        elif change == "pool":
            self.spec = replace(s, pool={None: "a", "a": "b", "b": None}[s.pool])
        elif change == "agent":
            self.spec = replace(s, agent="2" if s.agent == "1" else "1")
        else:
            self.spec = replace(s, max_unavailable=budget)

    def images_pushed(self) -> None:
        self.images |= {image_of(self.spec, k) for k in MAPPED}

    @rule(data=st.data(), what=st.sampled_from(["gpu", "pool", "taint", "version"]))
    def node_changes(self, data: st.DataObject, what: str) -> None:
        sim = self._node(data)
        if what == "gpu":
            sim.labels["gpu"] = "amd" if sim.labels["gpu"] == "intel" else "intel"
        elif what == "pool":
            sim.labels["pool"] = "a" if sim.labels["pool"] == "b" else "b"
        elif what == "taint":
            sim.taints = () if sim.taints else (TAINT,)
        elif self.spec.version:
            sim.labels[WANT] = self.spec.version

    @precondition(lambda self: not self.removing)
    @rule(now=st.integers(0, 9))
    def module_deleted(self, now: int) -> None:
        """From now on, only ``finalize`` passes: every node unloads. (Only one time in
        ten: most runs should see the Module live.)"""
        self.removing = now == 0

    @rule(pushed=st.booleans())
    def time_passes(self, pushed: bool) -> None:
        """A second goes by (pods made within one second tie); the spec's images may
        have been pushed meanwhile."""
        self.clock += 1
        if pushed:
            self.images_pushed()

    # -- liveness ---------------------------------------------------------------

    def _settle(self) -> None:
        """The kubelet, the agents and the device plugin do all they can."""
        for _ in range(4):
            for sim in self.nodes.values():
                if READY not in sim.labels:
                    sim.consumers = []
            for pod in list(self.pods.values()):
                if pod.view.deleting:
                    self._gone(pod)
            for pod in list(self.pods.values()):
                if pod.view.ended:
                    continue
                if pod.view.unloader:
                    self._unload(pod)
                else:
                    self._start(pod, self.nodes[pod.node])

    def teardown(self) -> None:
        """Once the world behaves, every node ends up as the Module asks."""
        if not self.nodes:
            return
        self.images_pushed()
        for sim in self.nodes.values():
            sim.ready = True
            if self.spec.version:
                sim.labels[WANT] = self.spec.version  # the admin lets every node update
        # An update takes a node about four passes; more than that for every node is a stall.
        for _ in range(5 * len(self.nodes) + 5):
            self.clock += 1
            self._settle()
            if not self._pass():
                break
        else:
            raise AssertionError(f"no end to the passes: {self._describe()}")
        final = self._plan([s.view() for s in self.nodes.values()])
        phases = {o.node: o.phase for o in final.outcomes}
        for sim in self.nodes.values():
            pods = self._on(sim.name)
            if self._selected(sim):
                assert len(pods) == 1, f"{sim.name}: {self._describe()}"
                pod = pods[0]
                assert not pod.view.unloader and pod.view.ready, self._describe()
                assert pod.view.module_hash == wanted_hash(self.spec, sim.kernel), sim.name
                # An old pod that unloads on SIGTERM is never renewed for a pod change alone.
                if pod.view.leaves_loaded:
                    assert pod.view.config_hash == wanted_config(self.spec, sim.kernel), sim.name
                assert sim.loaded == pod.view.module_hash, sim.name
                assert READY in sim.labels, sim.name
                assert sim.labels.get(VREADY) == (self.spec.version or None), sim.name
                assert phases[sim.name] is Phase.LOADED, (sim.name, phases)
            else:
                assert not pods, f"{sim.name}: pods left: {self._describe()}"
                assert sim.loaded is None, f"{sim.name}: left loaded"
                assert READY not in sim.labels and VREADY not in sim.labels, sim.name

    def _describe(self) -> str:
        lines = [f"spec {self.spec}, removing {self.removing}"]
        for sim in self.nodes.values():
            lines.append(
                f"{sim.name} {sim.kernel} loaded={sim.loaded} labels={sim.labels} "
                f"selected={self._selected(sim)}"
            )
            for p in self._on(sim.name):
                v = p.view
                lines.append(
                    f"  {v.name} unloader={v.unloader} phase={v.phase} ready={v.ready} "
                    f"deleting={v.deleting} hash={v.module_hash[:6]} kernel={v.kernel}"
                )
        return "\n".join(lines)


LoaderMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_loader_plan_machine = pytest.mark.timeout(120)(LoaderMachine.TestCase)
