"""Module-loader plans: which loader pod each node should run, and its labels.

One long-running loader pod per (Module, node) holds the module loaded (see
kmodkit.core.engine.loader_pod). After a reboot the kubelet restarts the pod and the module
is loaded again (KMM's most reported bug is a node that says "ready" after a
reboot with nothing loaded).

Everything the plan needs is observed state: the Module, the nodes, the loader
pods (whose annotations record the config, kernel and version they run), the
images known to exist, and, for nodes about to unload, the pods still gated on
the readiness label. The plan is a pure function; applying it twice changes
nothing.

Each node is decided alone (``decide``): from the node and its loader pod, what
its pod needs (keep, create, replace, retire), its label changes and its
outcome. Replacing a pod that works (an ``Update``) takes the module away from
whatever uses it, so those go through the budget pass afterwards, which lets
them go while maxUnavailable has room after counting every node that already
has nothing ready loaded.
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
    AgentConfigError,
    LoaderPod,
    LoaderSettings,
    for_node,
    pod_template,
)
from kmodkit.core.nodes import NodeView, blocking_taints, selector_matches


class ImageState(Enum):
    EXISTS = "Exists"
    MISSING = "Missing"
    BUILDING = "Building"
    BUILD_FAILED = "BuildFailed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class ImageStatus:
    state: ImageState
    detail: str = ""


class Phase(StrEnum):
    LOADED = "Loaded"
    LOADING = "Loading"
    UPDATING = "Updating"
    WAITING = "Waiting"
    FAILED = "Failed"


@dataclass(frozen=True)
class NodeOutcome:
    """One node's place in the Module's life, for status and events."""

    node: str
    phase: Phase
    reason: str
    message: str = ""
    mapping_index: int | None = None


@dataclass
class LoaderPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    node_labels: dict[str, dict[str, str | None]] = field(default_factory=dict)
    outcomes: list[NodeOutcome] = field(default_factory=list)
    awaiting_consumers: list[str] = field(default_factory=list)
    """Nodes about to unload whose gated pods the plan was not told about."""
    needed_images: dict[str, ResolvedMapping] = field(default_factory=dict)
    """Images targeted nodes need, with one resolution each (for checks and builds)."""
    nodes_by_image: dict[str, list[NodeView]] = field(default_factory=dict)
    module_error: str = ""
    """A problem with the whole Module (reported as Degraded)."""

    @property
    def targeted(self) -> int:
        return len(self.outcomes)


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
            version=module.spec.module_loader.container.version or "",
            tolerations=[
                t.model_dump(by_alias=True, exclude_none=True)
                for t in module.spec.tolerations or []
            ],
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
class NodeStep:
    """What one node gets this pass: its outcome, label changes and loader pod change."""

    node: str
    outcome: NodeOutcome | None = None
    labels: Mapping[str, str | None] = field(default_factory=dict)
    """Only the label changes the node really needs (none when converged)."""
    create: dict[str, Any] | None = None
    delete: str | None = None
    unavailable: bool = False
    """Nothing ready is loaded on the node: it counts against maxUnavailable."""
    image: ResolvedMapping | None = None
    """The mapping the node should run, when it should run one (for checks and builds)."""
    awaiting_consumers: bool = False
    """The node may unload once the caller says which pods are gated on its label."""


@dataclass(frozen=True)
class Update:
    """A node whose working loader pod runs an outdated config: only the budget lets it go."""

    node: NodeView
    pod: LoaderPod
    image: ResolvedMapping


def plan(
    module: Module,
    nodes: Sequence[NodeView],
    pods: Iterable[LoaderPod],
    images: Mapping[str, ImageStatus],
    settings: LoaderSettings,
    consumers: Mapping[str, Sequence[str]] | None = None,
) -> LoaderPlan:
    """What to create, delete and label so each node runs what the Module asks.

    ``consumers`` names, per node about to unload, the pods still gated on its
    readiness labels; a node missing from it is listed in ``awaiting_consumers``
    and not unloaded, so the caller lists pods only for those nodes and plans again.
    """
    ctx = Context.of(module, images, settings, consumers)
    by_node = {p.node: p for p in pods}
    out = LoaderPlan()
    if module.spec.module_loader.container.modprobe.raw_args is not None:
        out.module_error = (
            "spec.moduleLoader.container.modprobe.rawArgs: kmodkit's engine "
            "loads by module name so it can verify what is loaded; set "
            "moduleName (and args/parameters) instead"
        )
        return out
    ordered = sorted(nodes, key=lambda n: n.name)
    decisions = [decide(node, by_node.pop(node.name, None), ctx) for node in ordered]
    # Updates need their image whether or not the budget lets them go this pass.
    for node, decision in zip(ordered, decisions, strict=True):
        _record_image(out, node, decision.image)
    settled = [d for d in decisions if isinstance(d, NodeStep)]
    updates = [d for d in decisions if isinstance(d, Update)]
    for step in settled:
        _apply(out, step)
    # A pod whose node the caller does not know stays: a node cache still
    # filling (start-up, failover, a restarted watch) must never unload a
    # driver, and the pod GC removes pods of nodes that really are gone.
    budget = max_unavailable(
        module.spec.rollout_policy().max_unavailable, out.targeted + len(updates)
    )
    unavailable = sum(1 for s in settled if s.unavailable)
    for step in _within_budget(updates, unavailable, budget, ctx):
        _apply(out, step)
    out.outcomes.sort(key=lambda o: o.node)
    return out


def decide(node: NodeView, pod: LoaderPod | None, ctx: Context) -> NodeStep | Update:
    """What one node needs, from its own observations alone; an Update waits for the budget."""
    if not _selected(node, ctx):
        return _retire(node, pod, ctx)
    resolved = ctx.resolution(node.kernel)
    if isinstance(resolved, ResolveError):
        # Leave whatever runs there alone: a broken spec must not unload a node.
        return NodeStep(
            node.name,
            NodeOutcome(
                node.name, Phase.FAILED, "InvalidMapping", str(resolved), resolved.mapping_index
            ),
        )
    if isinstance(resolved, NoMatch):
        return _retire(node, pod, ctx, _no_mapping(node))
    if _version_held_back(node, pod, ctx):
        return _held_back(node, pod, resolved, ctx)
    return _run(node, pod, resolved, ctx)


def _within_budget(
    updates: Sequence[Update],
    unavailable: int,
    budget: int,
    ctx: Context,
) -> list[NodeStep]:
    """Which updates go now, given ``unavailable`` nodes already count against ``budget``."""
    steps = []
    # Updates already under way (label gone) finish first and count first.
    for update in sorted(updates, key=lambda u: ctx.ready_key in u.node.labels):
        under_way = ctx.ready_key not in update.node.labels
        if under_way or unavailable < budget:
            unavailable += 1
            steps.append(_unload(update, under_way, _holders(update.node, ctx), ctx))
        else:
            steps.append(_update_pending(update, budget, ctx))
    return steps


def _selected(node: NodeView, ctx: Context) -> bool:
    return selector_matches(ctx.module.spec.selector, node.labels) and not blocking_taints(
        node, ctx.tolerations
    )


def _version_held_back(node: NodeView, pod: LoaderPod | None, ctx: Context) -> bool:
    """The Module names a version the node is not labelled for and the pod does not run."""
    version = ctx.version
    labelled = node.labels.get(ctx.wanted_version_key) == version
    return bool(version) and not labelled and (pod is None or pod.version != version)


def _held_back(
    node: NodeView, pod: LoaderPod | None, resolved: ResolvedMapping, ctx: Context
) -> NodeStep:
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
        return NodeStep(node.name, outcome, _labels_from_pod(node, pod, ctx))
    return _retire(node, pod, ctx, outcome)


def _run(
    node: NodeView, pod: LoaderPod | None, resolved: ResolvedMapping, ctx: Context
) -> NodeStep | Update:
    """A node that should run ``resolved``: keep, create, replace or update its loader pod."""
    template = ctx.template(resolved)
    if isinstance(template, AgentConfigError):
        # As for an invalid mapping: leave what runs there alone, and
        # neither check nor build an image no loader pod would use.
        return NodeStep(
            node.name,
            NodeOutcome(
                node.name, Phase.FAILED, "InvalidAgentConfig", str(template), resolved.mapping_index
            ),
        )
    if pod is not None and pod.deleting:
        return _unloading(node, pod, resolved, ctx)
    if pod is not None and pod.config_hash == template["metadata"]["annotations"][CONFIG_HASH]:
        return _up_to_date(node, pod, resolved, ctx)
    image = ctx.images.get(resolved.container_image, ImageStatus(ImageState.UNKNOWN))
    if image.state is not ImageState.EXISTS:
        return _awaiting_image(node, pod, resolved, image, ctx)
    if pod is None:
        return _create(node, resolved, template, ctx)
    if not pod.ready or pod.kernel != node.kernel:
        return _replace(node, pod, resolved, ctx)
    return Update(node, pod, resolved)


def _unloading(node: NodeView, pod: LoaderPod, resolved: ResolvedMapping, ctx: Context) -> NodeStep:
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.UPDATING,
            "Unloading",
            f"loader pod {pod.name} is unloading",
            resolved.mapping_index,
        ),
        _unlabelled(node, ctx),
        unavailable=True,
        image=resolved,
    )


def _up_to_date(
    node: NodeView, pod: LoaderPod, resolved: ResolvedMapping, ctx: Context
) -> NodeStep:
    if pod.ready:
        outcome = NodeOutcome(node.name, Phase.LOADED, "Loaded", "", resolved.mapping_index)
    else:
        outcome = NodeOutcome(
            node.name,
            Phase.FAILED if pod.problem else Phase.LOADING,
            "LoadFailed" if pod.problem else "Loading",
            pod.problem or f"loader pod {pod.name} is starting",
            resolved.mapping_index,
        )
    return NodeStep(
        node.name,
        outcome,
        _labels_from_pod(node, pod, ctx),
        unavailable=not pod.ready,
        image=resolved,
    )


def _awaiting_image(
    node: NodeView,
    pod: LoaderPod | None,
    resolved: ResolvedMapping,
    image: ImageStatus,
    ctx: Context,
) -> NodeStep:
    return NodeStep(
        node.name,
        _image_outcome(node, resolved, image),
        # Keep the old module loaded until the new image exists.
        _labels_from_pod(node, pod, ctx)
        if pod is not None and pod.ready and pod.kernel == node.kernel
        else {},
        unavailable=pod is None or not pod.ready,
        image=resolved,
    )


def _create(
    node: NodeView, resolved: ResolvedMapping, template: Mapping[str, Any], ctx: Context
) -> NodeStep:
    desired = for_node(template, ctx.module, node)
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.LOADING,
            "Loading",
            f"creating loader pod {desired['metadata']['name']}",
            resolved.mapping_index,
        ),
        create=desired,
        unavailable=True,
        image=resolved,
    )


def _replace(node: NodeView, pod: LoaderPod, resolved: ResolvedMapping, ctx: Context) -> NodeStep:
    # Nothing useful is loaded (it never came up, or the node rebooted into
    # another kernel): replacing it spends no budget.
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.UPDATING,
            "Replacing",
            f"replacing loader pod {pod.name}",
            resolved.mapping_index,
        ),
        _unlabelled(node, ctx),
        delete=pod.name,
        unavailable=True,
        image=resolved,
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
        _labels_from_pod(node, update.pod, ctx),
        image=update.image,
    )


def _unload(
    update: Update, under_way: bool, holders: Sequence[str] | None, ctx: Context
) -> NodeStep:
    """Step 1 takes the readiness label away so gated pods leave the node; step 2,
    once nothing holds the module through the label, unloads it."""
    node, pod = update.node, update.pod
    if under_way and holders is not None and not holders:
        return NodeStep(
            node.name,
            NodeOutcome(
                node.name,
                Phase.UPDATING,
                "Unloading",
                f"unloading the old module ({pod.name})",
                update.image.mapping_index,
            ),
            _unlabelled(node, ctx),
            delete=pod.name,
            unavailable=True,
            image=update.image,
        )
    return NodeStep(
        node.name,
        NodeOutcome(
            node.name,
            Phase.UPDATING,
            "WaitingForConsumers",
            "waiting for pods gated on the readiness label to leave: " + ", ".join(holders)
            if holders
            else "readiness label removed",
            update.image.mapping_index,
        ),
        _unlabelled(node, ctx),
        unavailable=True,
        image=update.image,
        awaiting_consumers=under_way and holders is None,
    )


def _no_mapping(node: NodeView) -> NodeOutcome:
    return NodeOutcome(
        node.name,
        Phase.FAILED,
        "NoMapping",
        f"no kernelMapping matches kernel {node.kernel!r}; add a mapping for it or "
        "exclude the node with spec.selector",
    )


def _image_outcome(node: NodeView, resolved: ResolvedMapping, image: ImageStatus) -> NodeOutcome:
    img = resolved.container_image
    if image.state is ImageState.BUILDING:
        return NodeOutcome(
            node.name, Phase.WAITING, "Building", f"building {img}", resolved.mapping_index
        )
    if image.state is ImageState.BUILD_FAILED:
        return NodeOutcome(
            node.name,
            Phase.FAILED,
            "BuildFailed",
            f"build of {img} failed: {image.detail}",
            resolved.mapping_index,
        )
    if image.state is ImageState.MISSING:
        return NodeOutcome(
            node.name,
            Phase.FAILED,
            "ImageMissing",
            f"{img} does not exist and no build is configured for this kernel; "
            "push it or add a build to the mapping",
            resolved.mapping_index,
        )
    return NodeOutcome(
        node.name,
        Phase.WAITING,
        "CheckingImage",
        f"cannot tell yet whether {img} exists: {image.detail or 'checking'}",
        resolved.mapping_index,
    )


def _retire(
    node: NodeView, pod: LoaderPod | None, ctx: Context, outcome: NodeOutcome | None = None
) -> NodeStep:
    """The node should run no loader pod of this Module: as for an update, the labels go
    first, and the pod (the module) only once no pod gated on them is left there."""
    unlabel = _unlabelled(node, ctx)
    if pod is None or pod.deleting:
        return NodeStep(node.name, outcome, unlabel)
    holders = _holders(node, ctx)
    if not unlabel and holders is not None and not holders:
        return NodeStep(node.name, outcome, delete=pod.name)
    return NodeStep(node.name, outcome, unlabel, awaiting_consumers=not unlabel and holders is None)


def _holders(node: NodeView, ctx: Context) -> Sequence[str] | None:
    return None if ctx.consumers is None else ctx.consumers.get(node.name)


def _labels_from_pod(node: NodeView, pod: LoaderPod, ctx: Context) -> dict[str, str | None]:
    if pod.ready and not pod.deleting and pod.kernel == node.kernel:
        return _changes(node, {ctx.ready_key: "", ctx.version_ready_key: pod.version or None})
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
    if step.delete is not None:
        out.delete.append(step.delete)
    if step.awaiting_consumers:
        out.awaiting_consumers.append(step.node)
