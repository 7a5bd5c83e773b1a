"""Module-loader plans: which loader pod each node should run, and its labels.

One long-running loader pod per (Module, node) holds the module loaded (see
kmodkit.core.engine.loader_pod). After a reboot the kubelet restarts the pod and the module
is loaded again (KMM's most reported bug is a node that says "ready" after a
reboot with nothing loaded).

Everything the plan needs is observed state: the Module, the nodes, the loader
and unloader pods (whose annotations record the module, kernel and version they
run), the images known to exist, and, for nodes about to unload, the pods still
gated on the readiness labels. The plan is a pure function; applying it twice
changes nothing.

Each node is decided alone (``decide``) from the node and its pods. Three rules
keep a driver from being unloaded by accident:

- Deleting a loader pod never unloads: only an unloader pod does, and its
  success is the only proof that a node has nothing loaded.
- A node always has a pod recording what it runs: a successor is created in
  the pass that deletes its predecessor, and an unloader in the pass that
  deletes the loader pods.
- A node absent from the caller's node list is left alone (a cache still
  filling is not a fleet without nodes).

Replacing a pod that serves a changed module (an ``Update``) takes the module
away from whatever uses it, so those go through the budget pass, which lets
them go while maxUnavailable has room after counting every node that already
has nothing ready loaded; a pod that only needs renewing (a ``Refresh``: the
agent image, tolerations) is followed by one that adopts the loaded module,
within the same budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from kmodkit.core import labels
from kmodkit.core.api import Module
from kmodkit.core.engine.kernel_mapping import NoMatch, ResolvedMapping, ResolveError, resolve
from kmodkit.core.engine.loader_pod import (
    CONFIG_HASH,
    MODULE_HASH,
    AgentConfigError,
    LoaderPod,
    LoaderSettings,
    for_node,
    load_failure,
    pod_template,
    unload_pod,
)
from kmodkit.core.nodes import NodeView, blocking_taints, selector_matches


class ImageState(Enum):
    EXISTS = "Exists"
    MISSING = "Missing"
    BUILDING = "Building"
    BUILD_FAILED = "BuildFailed"
    SIGNING = "Signing"
    SIGN_FAILED = "SignFailed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class ImageStatus:
    state: ImageState
    detail: str = ""


UNLOAD_FAILED = "UnloadFailed"


class Phase(StrEnum):
    LOADED = "Loaded"
    LOADING = "Loading"
    UPDATING = "Updating"
    WAITING = "Waiting"
    FAILED = "Failed"
    UNMAPPED = "Unmapped"
    """Selected, but no kernel mapping serves the node's kernel: nothing to load there."""


@dataclass(frozen=True)
class NodeOutcome:
    """One node's place in the Module's life, for status and events."""

    node: str
    phase: Phase
    reason: str
    message: str = ""
    mapping_index: int | None = None
    kernel: str = ""
    """The node's kernel, where the outcome is about it (no mapping serves it)."""


@dataclass
class LoaderPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    deletes_by_node: dict[str, list[str]] = field(default_factory=dict)
    """``delete`` by node: a node whose new pod could not be made keeps its old one."""
    node_labels: dict[str, dict[str, str | None]] = field(default_factory=dict)
    outcomes: list[NodeOutcome] = field(default_factory=list)
    awaiting_consumers: list[str] = field(default_factory=list)
    """Nodes about to unload whose gated pods the plan was not told about."""
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Nodes whose unload waits for pods gated on the readiness label, and those pods."""
    unloaded: list[str] = field(default_factory=list)
    """Nodes whose unloader pod succeeded (deleted in this plan)."""
    needed_images: dict[str, ResolvedMapping] = field(default_factory=dict)
    """Images targeted nodes need, with one resolution each (for checks and builds)."""
    nodes_by_image: dict[str, list[NodeView]] = field(default_factory=dict)
    module_error: str = ""
    """A problem with the whole Module (reported as Degraded)."""

    @property
    def targeted(self) -> int:
        return len(self.outcomes)


@dataclass(frozen=True)
class NeededImages:
    """What a plan says about images, whatever their states: which images the targeted
    nodes need (a node's image follows from its kernel alone) and which nodes need each."""

    images: Mapping[str, ResolvedMapping]
    nodes: Mapping[str, Sequence[NodeView]]

    @classmethod
    def of(cls, made: LoaderPlan) -> NeededImages:
        return cls(made.needed_images, made.nodes_by_image)

    def covers(self, made: LoaderPlan, states: Mapping[str, ImageStatus]) -> bool:
        """Whether image states worked out for these images are those ``made`` needs: the
        same images, and, unless every one exists (no build or sign to plan, for which
        the nodes of each image are the candidates), the same nodes."""
        if made.needed_images != self.images:
            return False
        every_one_exists = all(s.state is ImageState.EXISTS for s in states.values())
        return every_one_exists or made.nodes_by_image == self.nodes


def max_unavailable(value: int | str, targeted: int) -> int:
    """The budget as a node count: a percentage rounds down, never below one."""
    if isinstance(value, int):
        return max(1, value)
    return max(1, math.floor(targeted * int(value.rstrip("%")) / 100))


def gated_on(pod: Mapping[str, Any], key: str) -> bool:
    """Whether ``pod`` runs only where the node carries label ``key`` (a device plugin,
    say): such a pod holds the driver and must leave before the module unloads."""
    spec = pod.get("spec") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if key in (spec.get("nodeSelector") or {}):
        return True
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return any(
        expr.get("key") == key
        for term in required.get("nodeSelectorTerms") or []
        for expr in term.get("matchExpressions") or []
    )


@dataclass(frozen=True)
class Context:
    """What every node's decision reads besides the node and its pod."""

    module: Module
    images: Mapping[str, ImageStatus]
    settings: LoaderSettings
    ready_key: str
    version_ready_key: str
    wanted_version_key: str
    version: str
    tolerations: list[dict[str, Any]]
    consumers: Mapping[str, Sequence[str]] | None = None
    """Per node about to unload, the pods still gated on its labels; None: not listed yet."""
    # Resolving and templating depend on the kernel only: once per kernel per pass.
    _resolutions: dict[str, ResolvedMapping | NoMatch | ResolveError] = field(
        default_factory=dict, init=False, repr=False
    )
    _templates: dict[str, dict[str, Any] | AgentConfigError] = field(
        default_factory=dict, init=False, repr=False
    )

    @classmethod
    def of(
        cls,
        module: Module,
        images: Mapping[str, ImageStatus],
        settings: LoaderSettings,
        consumers: Mapping[str, Sequence[str]] | None = None,
    ) -> Context:
        ns, name = module.metadata.namespace or "", module.metadata.name or ""
        return cls(
            module=module,
            images=images,
            settings=settings,
            ready_key=labels.READY.key(ns, name),
            version_ready_key=labels.VERSION_READY.key(ns, name),
            wanted_version_key=labels.MODULE_VERSION.key(ns, name),
            version=(loader.container.version or "")
            if (loader := module.spec.module_loader)
            else "",
            tolerations=module.spec.pod_tolerations(),
            consumers=consumers,
        )

    def resolution(self, kernel: str) -> ResolvedMapping | NoMatch | ResolveError:
        if kernel not in self._resolutions:
            try:
                self._resolutions[kernel] = resolve(self.module, kernel)
            except ResolveError as err:
                self._resolutions[kernel] = err
        return self._resolutions[kernel]

    def template(self, resolved: ResolvedMapping) -> dict[str, Any] | AgentConfigError:
        if resolved.kernel not in self._templates:
            try:
                self._templates[resolved.kernel] = pod_template(
                    self.module, resolved, self.settings
                )
            except AgentConfigError as err:
                self._templates[resolved.kernel] = err
        return self._templates[resolved.kernel]


@dataclass(frozen=True)
class NodePods:
    """The Module's pods on one node, sorted newest first."""

    live: tuple[LoaderPod, ...] = ()
    """Loader pods that run (or will): neither deleted nor ended."""
    ended: tuple[LoaderPod, ...] = ()
    """Loader pods the kubelet will not run again (shut down, evicted, rejected)."""
    leaving: tuple[LoaderPod, ...] = ()
    """Loader pods being deleted."""
    unloader: LoaderPod | None = None

    @classmethod
    def of(cls, pods: Iterable[LoaderPod]) -> NodePods:
        ordered = sorted(pods, key=lambda p: (p.created, p.name), reverse=True)
        loaders = [p for p in ordered if not p.unloader]
        return cls(
            live=tuple(p for p in loaders if not p.deleting and not p.ended),
            ended=tuple(p for p in loaders if not p.deleting and p.ended),
            leaving=tuple(p for p in loaders if p.deleting),
            unloader=next((p for p in ordered if p.unloader and not p.deleting), None),
        )

    @property
    def newest(self) -> LoaderPod | None:
        """The pod a successor follows (and whose configuration an unloader takes)."""
        return next(iter((*self.live, *self.ended, *self.leaving)), None)

    @property
    def to_remove(self) -> tuple[LoaderPod, ...]:
        return (*self.live, *self.ended)

    @property
    def unloading_themselves(self) -> bool:
        """Old loader pods unload on SIGTERM: a new pod loads only once they are gone."""
        return any(not p.leaves_loaded for p in self.leaving)


@dataclass(frozen=True)
class NodeStep:
    """What one node gets this pass: its outcome, label changes and pod changes."""

    node: str
    outcome: NodeOutcome | None = None
    labels: Mapping[str, str | None] = field(default_factory=dict)
    """Only the label changes the node really needs (none when converged)."""
    create: dict[str, Any] | None = None
    delete: tuple[str, ...] = ()
    """Deleted after ``create`` is made: a node never goes without a pod recording it."""
    unavailable: bool = False
    """Nothing ready is loaded on the node: it counts against maxUnavailable."""
    in_flight: bool = False
    """A loader pod is being replaced without unloading: it counts against the budget too."""
    image: ResolvedMapping | None = None
    """The mapping the node should run, when it should run one (for checks and builds)."""
    awaiting_consumers: bool = False
    """The node may unload once the caller says which pods are gated on its label."""
    held_by: tuple[str, ...] = ()
    """The pods gated on the readiness label that the node's unload waits for."""
    unloaded: bool = False
    """An unloader pod succeeded: the module is out of the kernel, and its record goes."""


@dataclass(frozen=True)
class Update:
    """A node whose working loader pod runs an outdated module: only the budget lets it go."""

    node: NodeView
    pod: LoaderPod
    image: ResolvedMapping
    template: Mapping[str, Any]
    in_flight: bool = False
    """A new pod of the same module starts beside it (a Refresh under way): the node
    holds its place in the budget already."""
    leaving: tuple[str, ...] = ()
    """The node's loader pods being deleted."""


@dataclass(frozen=True)
class Refresh:
    """A node whose loader pod runs the right module in an outdated pod: a new pod adopts
    the module, within the budget so that a bad pod change cannot reach every node at once."""

    node: NodeView
    pod: LoaderPod
    image: ResolvedMapping
    template: Mapping[str, Any]


def plan(
    module: Module,
    nodes: Sequence[NodeView],
    pods: Iterable[LoaderPod],
    images: Mapping[str, ImageStatus],
    settings: LoaderSettings,
    consumers: Mapping[str, Sequence[str]] | None = None,
    *,
    removing: bool = False,
) -> LoaderPlan:
    """What to create, delete and label so each node runs what the Module asks.

    ``consumers`` names, per node about to unload, the pods still gated on its
    readiness labels; a node missing from it is listed in ``awaiting_consumers``
    and not unloaded, so the caller lists pods only for those nodes and plans again.
    ``removing``: the Module is being deleted, and every node unloads.
    """
    ctx = Context.of(module, images, settings, consumers)
    by_node = _by_node(pods)
    out = LoaderPlan()
    ordered = sorted(nodes, key=lambda n: n.name)
    # Without a module loader (removed, or a device-plugin-only Module) every node unloads.
    if removing or module.spec.module_loader is None:
        for node in ordered:
            mine = NodePods.of(by_node.get(node.name, ()))
            _apply(
                out,
                _unloader(node, mine, ctx, False) if mine.unloader else _retire(node, mine, ctx),
            )
        return out
    decisions = [decide(node, by_node.get(node.name, ()), ctx) for node in ordered]
    # Updates need their image whether or not the budget lets them go this pass.
    for node, decision in zip(ordered, decisions, strict=True):
        _record_image(out, node, decision.image)
    settled = [d for d in decisions if isinstance(d, NodeStep)]
    waiting = [d for d in decisions if not isinstance(d, NodeStep)]
    for step in settled:
        _apply(out, step)
    # A pod whose node the caller does not know stays: a node cache still
    # filling (start-up, failover, a restarted watch) must never unload a
    # driver, and the pod GC removes pods of nodes that really are gone.
    # A percentage is of the nodes the selector targets: a node the Module left whose
    # unload fails is reported, but is not one of them.
    targeted = sum(
        1
        for node, d in zip(ordered, decisions, strict=True)
        if _selected(node, ctx) and (not isinstance(d, NodeStep) or d.outcome is not None)
    )
    budget = max_unavailable(module.spec.rollout_policy().max_unavailable, targeted)
    spent = sum(1 for s in settled if s.unavailable or s.in_flight)
    for step in _within_budget(waiting, spent, budget, ctx):
        _apply(out, step)
    out.outcomes.sort(key=lambda o: o.node)
    return out


def labels_follow_pods(
    namespace: str, name: str, nodes: Iterable[NodeView], pods: Iterable[LoaderPod]
) -> dict[str, dict[str, str | None]]:
    """The label changes that keep each node's labels true to its loader pods, for a
    Module that cannot be planned (it fails validation): nothing is created or deleted."""
    ready_key = labels.READY.key(namespace, name)
    version_key = labels.VERSION_READY.key(namespace, name)
    by_node = _by_node(pods)
    changes = {}
    for node in nodes:
        ready = _ready_pod(node, NodePods.of(by_node.get(node.name, ())).live)
        want = {ready_key: "", version_key: ready.version or None} if ready else {}
        change = _changes(node, {ready_key: None, version_key: None, **want})
        if change:
            changes[node.name] = change
    return changes


def _by_node(pods: Iterable[LoaderPod]) -> dict[str, list[LoaderPod]]:
    by_node: dict[str, list[LoaderPod]] = {}
    for pod in pods:
        by_node.setdefault(pod.node, []).append(pod)
    return by_node


def decide(node: NodeView, pods: Iterable[LoaderPod], ctx: Context) -> NodeStep | Update | Refresh:
    """What one node needs, from its own observations alone; an Update or a Refresh
    waits for the budget."""
    mine = NodePods.of(pods)
    if mine.unloader is not None:
        # An unload under way finishes before anything else happens on the node.
        targeted = _selected(node, ctx) and not isinstance(ctx.resolution(node.kernel), NoMatch)
        return _unloader(node, mine, ctx, targeted)
    if not _selected(node, ctx):
        return _retire(node, mine, ctx)
    resolved = ctx.resolution(node.kernel)
    if isinstance(resolved, ResolveError):
        # Leave whatever runs there alone: a broken spec must not unload a node.
        outcome = NodeOutcome(
            node.name, Phase.FAILED, "InvalidMapping", str(resolved), resolved.mapping_index
        )
        return _hold(node, mine, ctx, outcome)
    if isinstance(resolved, NoMatch):
        return _retire(node, mine, ctx, _no_mapping(node))
    if _version_held_back(node, mine.live, ctx):
        return _held_back(node, mine, resolved, ctx)
    return _run(node, mine, resolved, ctx)


def _within_budget(
    waiting: Sequence[Update | Refresh],
    spent: int,
    budget: int,
    ctx: Context,
) -> list[NodeStep]:
    """Which updates and refreshes go now, given ``spent`` of ``budget`` is in use."""
    steps = []

    # Updates already under way (label gone) or in flight finish first and count first,
    # before any refresh (whose node may lack the label only because it just loaded).
    def holds_place(u: Update | Refresh) -> bool:
        return isinstance(u, Update) and (ctx.ready_key not in u.node.labels or u.in_flight)

    for entry in sorted(waiting, key=lambda u: not holds_place(u)):
        if isinstance(entry, Refresh):
            go = spent < budget
            spent += go
            steps.append(_refresh(entry, go, budget, ctx))
            continue
        under_way = ctx.ready_key not in entry.node.labels
        if holds_place(entry) or spent < budget:
            spent += 1
            steps.append(_unload(entry, under_way, _holders(entry.node, ctx), ctx))
        else:
            steps.append(_update_pending(entry, budget, ctx))
    return steps


def _selected(node: NodeView, ctx: Context) -> bool:
    return selector_matches(ctx.module.spec.selector, node.labels) and not blocking_taints(
        node, ctx.tolerations
    )


def _version_held_back(node: NodeView, live: Sequence[LoaderPod], ctx: Context) -> bool:
    """The Module names a version the node is not labelled for and no pod runs."""
    version = ctx.version
    labelled = node.labels.get(ctx.wanted_version_key) == version
    return bool(version) and not labelled and all(p.version != version for p in live)


def _held_back(node: NodeView, pods: NodePods, resolved: ResolvedMapping, ctx: Context) -> NodeStep:
    pod = pods.live[0] if pods.live else None
    have = f"version {pod.version!r} stays loaded" if pod else "nothing is loaded"
    outcome = NodeOutcome(
        node.name,
        Phase.WAITING,
        "AwaitingVersionLabel",
        f"{have}; label the node {ctx.wanted_version_key}={ctx.version} "
        f"to load version {ctx.version}",
        resolved.mapping_index,
    )
    if pod is not None and pod.kernel == node.kernel:
        return NodeStep(node.name, outcome, _labels_from_pods(node, pods.live, ctx))
    return _retire(node, pods, ctx, outcome)


def _hold(
    node: NodeView, pods: NodePods, ctx: Context, outcome: NodeOutcome | None = None
) -> NodeStep:
    """Touch no pod (the spec cannot say what the node should run), but keep the labels
    true: a loader pod that stops being ready takes the label away with it."""
    return NodeStep(node.name, outcome, _labels_from_pods(node, pods.live, ctx))


def _run(
    node: NodeView, pods: NodePods, resolved: ResolvedMapping, ctx: Context
) -> NodeStep | Update | Refresh:
    """A node that should run ``resolved``: keep, create, replace or update its loader pod."""
    template = ctx.template(resolved)
    if isinstance(template, AgentConfigError):
        # As for an invalid mapping: leave what runs there alone, and
        # neither check nor build an image no loader pod would use.
        outcome = NodeOutcome(
            node.name, Phase.FAILED, "InvalidAgentConfig", str(template), resolved.mapping_index
        )
        return _hold(node, pods, ctx, outcome)
    wanted = template["metadata"]["annotations"][MODULE_HASH]
    current = next((p for p in pods.live if p.module_hash == wanted), None)
    if current is not None:
        return _current(node, pods, current, resolved, template, ctx)
    image = ctx.images.get(resolved.container_image, ImageStatus(ImageState.UNKNOWN))
    if image.state is not ImageState.EXISTS:
        return _awaiting_image(node, pods, resolved, image, ctx)
    if not pods.live:
        return _create(node, pods, resolved, template, ctx)
    # An older pod may serve while the newest starts (a Refresh under way): that is an
    # update like any other, within the budget and once the gated pods are gone.
    serving = _ready_pod(node, pods.live)
    if serving is None:
        return _replace(node, pods.live[0], resolved, template, ctx, pods.leaving)
    renewing = sum(1 for p in pods.live if p.module_hash == serving.module_hash) > 1
    leaving = tuple(p.name for p in pods.leaving)
    return Update(node, serving, resolved, template, renewing, leaving)


def _current(
    node: NodeView,
    pods: NodePods,
    current: LoaderPod,
    resolved: ResolvedMapping,
    template: Mapping[str, Any],
    ctx: Context,
) -> NodeStep | Refresh:
    """A live pod runs the wanted module: report it, retire what it supersedes, and
    give it a new pod when the pod itself is outdated."""
    same = [p for p in pods.live if p.module_hash == current.module_hash]
    ready = _ready_pod(node, same)
    # Older pods of the same module go once the newest serves; pods of another
    # module go at once (an update decided to let them go).
    superseded = [
        p
        for p in (*pods.live, *pods.ended)
        if p is not current and (ready is current or p.module_hash != current.module_hash)
    ]
    if ready is current:
        outcome = NodeOutcome(node.name, Phase.LOADED, "Loaded", "", resolved.mapping_index)
    elif ready is not None:
        outcome = NodeOutcome(
            node.name,
            Phase.LOADED,
            "Refreshing",
            f"loader pod {current.name} takes over from {ready.name}",
            resolved.mapping_index,
        )
    elif current.problem:
        reason, message = load_failure(current)
        outcome = NodeOutcome(node.name, Phase.FAILED, reason, message, resolved.mapping_index)
    else:
        outcome = NodeOutcome(
            node.name,
            Phase.LOADING,
            "Loading",
            f"loader pod {current.name} is starting",
            resolved.mapping_index,
        )
    outdated = current.config_hash != template["metadata"]["annotations"][CONFIG_HASH]
    if outdated and current.leaves_loaded and len(same) == 1:
        if ready is not current:
            # Not working anyway: replace it without waiting for the budget.
            return _replace(node, current, resolved, template, ctx, pods.leaving)
        # A new pod that ended goes first: its successor would take its name again.
        if not superseded:
            return Refresh(node, current, resolved, template)
    return NodeStep(
        node.name,
        outcome,
        _labels_from_pods(node, same, ctx),
        delete=tuple(p.name for p in superseded),
        unavailable=ready is None,
        in_flight=len(same) > 1,
        image=resolved,
    )


def _awaiting_image(
    node: NodeView,
    pods: NodePods,
    resolved: ResolvedMapping,
    image: ImageStatus,
    ctx: Context,
) -> NodeStep:
    # Keep the old module loaded (and labelled while it serves) until the new image exists.
    labels_now = _labels_from_pods(node, pods.live, ctx)
    return NodeStep(
        node.name,
        _image_outcome(node, resolved, image),
        labels_now,
        unavailable=_ready_pod(node, pods.live) is None,
        image=resolved,
    )


def _create(
    node: NodeView,
    pods: NodePods,
    resolved: ResolvedMapping,
    template: Mapping[str, Any],
    ctx: Context,
) -> NodeStep:
    """No loader pod runs: make one, which adopts whatever an ended pod left loaded."""
    if pods.unloading_themselves:
        return _waiting_for_old_pods(node, pods, resolved, ctx)
    after = pods.newest
    desired = for_node(template, ctx.module, node, after.uid if after else "")
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.LOADING,
            "Loading",
            f"creating loader pod {desired['metadata']['name']}",
            resolved.mapping_index,
        ),
        _unlabelled(node, ctx),
        create=desired,
        delete=tuple(p.name for p in pods.ended),
        unavailable=True,
        image=resolved,
    )


def _waiting_for_old_pods(
    node: NodeView, pods: NodePods, resolved: ResolvedMapping, ctx: Context
) -> NodeStep:
    message = f"loader pod {pods.leaving[0].name} is unloading"
    return _going(node, "Unloading", message, resolved, ctx)


def _going(
    node: NodeView,
    reason: str,
    message: str,
    resolved: ResolvedMapping,
    ctx: Context,
    create: dict[str, Any] | None = None,
    delete: tuple[str, ...] = (),
) -> NodeStep:
    """A node whose module is being replaced: unlabelled, and counted unavailable."""
    return NodeStep(
        node.name,
        NodeOutcome(node.name, Phase.UPDATING, reason, message, resolved.mapping_index),
        _unlabelled(node, ctx),
        create=create,
        delete=delete,
        unavailable=True,
        image=resolved,
    )


def _successor(
    node: NodeView,
    pod: LoaderPod,
    template: Mapping[str, Any],
    ctx: Context,
    leaving: Iterable[str] = (),
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """What replaces ``pod``: its successor is made first and the pod deleted in the same
    pass; a pod that unloads on SIGTERM is deleted alone, its successor made once it is gone.

    A successor's name follows from ``pod``: an earlier successor of it still being
    deleted (``leaving``) holds that name, and asking for it would be told it exists,
    so ``pod`` stays until that one is gone."""
    if not pod.leaves_loaded:
        return None, (pod.name,)
    successor = for_node(template, ctx.module, node, pod.uid)
    if successor["metadata"]["name"] in set(leaving):
        return None, ()
    return successor, (pod.name,)


def _replace(
    node: NodeView,
    pod: LoaderPod,
    resolved: ResolvedMapping,
    template: Mapping[str, Any],
    ctx: Context,
    leaving: Iterable[LoaderPod] = (),
) -> NodeStep:
    # Nothing useful is loaded (it never came up, or the node rebooted into
    # another kernel): replacing it spends no budget.
    create, delete = _successor(node, pod, template, ctx, (p.name for p in leaving))
    message = f"replacing loader pod {pod.name}"
    return _going(node, "Replacing", message, resolved, ctx, create, delete)


def _refresh(refresh: Refresh, go: bool, budget: int, ctx: Context) -> NodeStep:
    node, pod = refresh.node, refresh.pod
    create = for_node(refresh.template, ctx.module, node, pod.uid) if go else None
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.LOADED,
            "Refreshing" if go else "RefreshPending",
            f"a new loader pod takes over from {pod.name} without reloading the module"
            if go
            else f"a new loader pod waits for the rollout budget (maxUnavailable {budget})",
            refresh.image.mapping_index,
        ),
        _labels_from_pods(node, (pod,), ctx),
        create=create,
        in_flight=go,
        image=refresh.image,
    )


def _update_pending(update: Update, budget: int, ctx: Context) -> NodeStep:
    node = update.node
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.UPDATING,
            "UpdatePending",
            f"waiting for the rollout budget (maxUnavailable {budget})",
            update.image.mapping_index,
        ),
        _labels_from_pods(node, (update.pod,), ctx),
        image=update.image,
    )


def _unload(
    update: Update, under_way: bool, holders: Sequence[str] | None, ctx: Context
) -> NodeStep:
    """Step 1 takes the readiness label away so gated pods leave the node; step 2,
    once nothing holds the module through the label, replaces the loader pod (the
    new one swaps the module)."""
    node, pod = update.node, update.pod
    if under_way and holders is not None and not holders:
        create, delete = _successor(node, pod, update.template, ctx, update.leaving)
        message = f"replacing the old module ({pod.name})"
        return _going(node, "Unloading", message, update.image, ctx, create, delete)
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.UPDATING,
            "WaitingForConsumers",
            "waiting for pods gated on the readiness label to leave: " + ", ".join(holders)
            if holders
            else "readiness label removed; the module is replaced once no pod gated on it runs",
            update.image.mapping_index,
        ),
        _unlabelled(node, ctx),
        unavailable=True,
        image=update.image,
        awaiting_consumers=under_way and holders is None,
        held_by=tuple(holders or ()),
    )


def _unloader(node: NodeView, pods: NodePods, ctx: Context, targeted: bool) -> NodeStep:
    """An unloader pod runs: it is the node's record until it succeeds."""
    unloader = pods.unloader
    assert unloader is not None
    if unloader.phase == "Succeeded":
        # Nothing of the Module is loaded: the node starts afresh next pass.
        reason, phase, message = "Unloaded", Phase.UPDATING, "the module was unloaded"
        create, delete = None, (unloader.name, *(p.name for p in pods.to_remove))
    elif unloader.ended:
        # The kubelet gave up on it (node shutdown, eviction): a new one takes over.
        reason, phase = "Unloading", Phase.UPDATING
        message = f"unloader pod {unloader.name} ended ({unloader.problem or unloader.phase})"
        create = unload_pod(ctx.module, unloader, ctx.settings, unloader.uid)
        delete = (unloader.name,)
    else:
        failed = unloader.restarts > 0 and bool(unloader.problem)
        reason, phase = (UNLOAD_FAILED, Phase.FAILED) if failed else ("Unloading", Phase.UPDATING)
        message = (
            f"unloading failed, trying again: {unloader.problem}"
            if failed
            else f"unloader pod {unloader.name} is unloading the module"
        )
        create, delete = None, tuple(p.name for p in pods.to_remove)
    # A failed unload is reported even on a node the Module no longer targets.
    report = targeted or reason == UNLOAD_FAILED
    outcome = NodeOutcome(node.name, phase, reason, message) if report else None
    return NodeStep(
        node.name,
        outcome,
        _unlabelled(node, ctx),
        create=create,
        delete=delete,
        unavailable=targeted,
        unloaded=unloader.phase == "Succeeded",
    )


def _no_mapping(node: NodeView) -> NodeOutcome:
    return NodeOutcome(
        node.name,
        Phase.UNMAPPED,
        "NoMapping",
        f"no kernelMapping matches kernel {node.kernel!r}; add a mapping for it or "
        "exclude the node with spec.selector",
        kernel=node.kernel,
    )


def _image_outcome(node: NodeView, resolved: ResolvedMapping, image: ImageStatus) -> NodeOutcome:
    img = resolved.container_image
    index = resolved.mapping_index
    unsigned = resolved.sign.unsigned_image if resolved.sign is not None else ""
    if image.state is ImageState.BUILDING:
        also = f" (unsigned, to be signed as {img})" if unsigned else ""
        return NodeOutcome(
            node.name, Phase.WAITING, "Building", f"building {resolved.build_target}{also}", index
        )
    if image.state is ImageState.BUILD_FAILED:
        return NodeOutcome(
            node.name,
            Phase.FAILED,
            "BuildFailed",
            f"build of {resolved.build_target} failed: {image.detail}",
            index,
        )
    if image.state is ImageState.SIGNING:
        return NodeOutcome(
            node.name, Phase.WAITING, "Signing", f"signing {unsigned} as {img}", index
        )
    if image.state is ImageState.SIGN_FAILED:
        return NodeOutcome(
            node.name, Phase.FAILED, "SignFailed", f"signing {img} failed: {image.detail}", index
        )
    if image.state is ImageState.MISSING:
        if unsigned:
            return NodeOutcome(
                node.name,
                Phase.FAILED,
                "ImageMissing",
                f"{img} does not exist, nor does {unsigned}, the unsigned image it is signed "
                f"from; push {unsigned} or add a build to the mapping",
                index,
            )
        return NodeOutcome(
            node.name,
            Phase.FAILED,
            "ImageMissing",
            f"{img} does not exist and no build is configured for this kernel; "
            "push it or add a build to the mapping",
            index,
        )
    return NodeOutcome(
        node.name,
        Phase.WAITING,
        "CheckingImage",
        f"cannot tell yet whether {img} exists: {image.detail or 'checking'}",
        resolved.mapping_index,
    )


def _retire(
    node: NodeView, pods: NodePods, ctx: Context, outcome: NodeOutcome | None = None
) -> NodeStep:
    """The node should run no loader pod of this Module: as for an update, the labels go
    first; once no pod gated on them is left, an unloader pod unloads the module and
    the loader pods go (it is created first, so the node never loses its record)."""
    unlabel = _unlabelled(node, ctx)
    source = pods.newest
    if source is None:
        return NodeStep(node.name, outcome, unlabel)
    # Even a pod on its way out (one that unloads on SIGTERM, or one someone else
    # deleted) gets an unloader: only its success says nothing is left loaded.
    holders = _holders(node, ctx)
    if unlabel or holders is None or holders:
        return NodeStep(
            node.name,
            outcome,
            unlabel,
            awaiting_consumers=not unlabel and holders is None,
            held_by=tuple(holders or ()),
        )
    return NodeStep(
        node.name,
        outcome,
        create=unload_pod(ctx.module, source, ctx.settings, source.uid),
        delete=tuple(p.name for p in pods.to_remove),
    )


def _holders(node: NodeView, ctx: Context) -> Sequence[str] | None:
    return None if ctx.consumers is None else ctx.consumers.get(node.name)


def _ready_pod(node: NodeView, pods: Iterable[LoaderPod]) -> LoaderPod | None:
    """The newest pod that serves the module on the node's running kernel."""
    return next((p for p in pods if p.ready and p.kernel == node.kernel), None)


def _labels_from_pods(
    node: NodeView, pods: Iterable[LoaderPod], ctx: Context
) -> dict[str, str | None]:
    ready = _ready_pod(node, pods)
    if ready is not None:
        return _changes(node, {ctx.ready_key: "", ctx.version_ready_key: ready.version or None})
    return _unlabelled(node, ctx)


def _unlabelled(node: NodeView, ctx: Context) -> dict[str, str | None]:
    return _changes(node, {ctx.ready_key: None, ctx.version_ready_key: None})


def _changes(node: NodeView, want: Mapping[str, str | None]) -> dict[str, str | None]:
    """Only the label changes ``node`` really needs (zero writes when converged)."""
    return {k: v for k, v in want.items() if node.labels.get(k) != v}


def _record_image(out: LoaderPlan, node: NodeView, resolved: ResolvedMapping | None) -> None:
    if resolved is not None:
        out.needed_images.setdefault(resolved.container_image, resolved)
        out.nodes_by_image.setdefault(resolved.container_image, []).append(node)


def _apply(out: LoaderPlan, step: NodeStep) -> None:
    if step.outcome is not None:
        out.outcomes.append(step.outcome)
    if step.labels:
        out.node_labels.setdefault(step.node, {}).update(step.labels)
    if step.create is not None:
        out.create.append(step.create)
    out.delete.extend(step.delete)
    if step.delete:
        out.deletes_by_node.setdefault(step.node, []).extend(step.delete)
    if step.awaiting_consumers:
        out.awaiting_consumers.append(step.node)
    if step.held_by:
        out.held[step.node] = step.held_by
    if step.unloaded:
        out.unloaded.append(step.node)
