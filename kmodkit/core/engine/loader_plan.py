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


def plan(
    module: Module,
    nodes: Sequence[NodeView],
    pods: Iterable[LoaderPod],
    images: Mapping[str, ImageStatus],
    settings: LoaderSettings,
    consumers: Mapping[str, Sequence[str]] | None = None,
) -> LoaderPlan:
    """What to create, delete and label so each node runs what the Module asks.

    ``consumers`` names, per node about to unload, the pods still gated on the
    readiness label; a node missing from it is listed in ``awaiting_consumers``
    and not unloaded, so the caller lists pods only for those nodes and plans again.
    """
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    ready_key = labels.READY.key(ns, name)
    version_ready_key = labels.VERSION_READY.key(ns, name)
    wanted_version_key = labels.MODULE_VERSION.key(ns, name)
    version = module.spec.module_loader.container.version or ""
    tolerations = [
        t.model_dump(by_alias=True, exclude_none=True) for t in module.spec.tolerations or []
    ]
    by_node = {p.node: p for p in pods}
    consumers = consumers or {}
    out = LoaderPlan()
    if module.spec.module_loader.container.modprobe.raw_args is not None:
        out.module_error = (
            "spec.moduleLoader.container.modprobe.rawArgs: kmodkit's engine "
            "loads by module name so it can verify what is loaded; set "
            "moduleName (and args/parameters) instead"
        )
        return out

    # Decide per node what it should run; updates are budgeted afterwards.
    updates: list[tuple[NodeView, LoaderPod, ResolvedMapping]] = []
    # Resolving and templating depend on the kernel only: once per kernel per pass.
    resolutions: dict[str, ResolvedMapping | NoMatch | ResolveError] = {}
    templates: dict[str, dict[str, Any] | AgentConfigError] = {}
    unavailable = 0
    for node in sorted(nodes, key=lambda n: n.name):
        pod = by_node.pop(node.name, None)
        if not selector_matches(module.spec.selector, node.labels) or blocking_taints(
            node, tolerations
        ):
            _retire(out, node, pod, ready_key, version_ready_key)
            continue
        if node.kernel not in resolutions:
            try:
                resolutions[node.kernel] = resolve(module, node.kernel)
            except ResolveError as err:
                resolutions[node.kernel] = err
        resolved = resolutions[node.kernel]
        if isinstance(resolved, ResolveError):
            # Leave whatever runs there alone: a broken spec must not unload a node.
            out.outcomes.append(
                NodeOutcome(
                    node.name, Phase.FAILED, "InvalidMapping", str(resolved), resolved.mapping_index
                )
            )
            continue
        if isinstance(resolved, NoMatch):
            _retire(out, node, pod, ready_key, version_ready_key)
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.FAILED,
                    "NoMapping",
                    f"no kernelMapping matches kernel {node.kernel!r}; add a mapping for it or "
                    "exclude the node with spec.selector",
                )
            )
            continue

        gated = bool(version) and node.labels.get(wanted_version_key) != version
        pod_version_current = not version or (pod is not None and pod.version == version)
        if gated and (pod is None or not pod_version_current):
            outcome = _held_back(node, pod, version, wanted_version_key, resolved)
            if pod is not None and pod.kernel == node.kernel:
                _label_from_pod(out, node, pod, ready_key, version_ready_key)
            else:
                _retire(out, node, pod, ready_key, version_ready_key)
            out.outcomes.append(outcome)
            continue

        if resolved.kernel not in templates:
            try:
                templates[resolved.kernel] = pod_template(module, resolved, settings)
            except AgentConfigError as err:
                templates[resolved.kernel] = err
        template = templates[resolved.kernel]
        if isinstance(template, AgentConfigError):
            # As for an invalid mapping: leave what runs there alone, and
            # neither check nor build an image no loader pod would use.
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.FAILED,
                    "InvalidAgentConfig",
                    str(template),
                    resolved.mapping_index,
                )
            )
            continue
        out.needed_images.setdefault(resolved.container_image, resolved)
        out.nodes_by_image.setdefault(resolved.container_image, []).append(node)
        desired_hash = template["metadata"]["annotations"][CONFIG_HASH]
        image = images.get(resolved.container_image, ImageStatus(ImageState.UNKNOWN))

        if pod is not None and pod.deleting:
            _unlabel(out, node, ready_key, version_ready_key)
            unavailable += 1
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.UPDATING,
                    "Unloading",
                    f"loader pod {pod.name} is unloading",
                    resolved.mapping_index,
                )
            )
            continue
        if pod is not None and pod.config_hash == desired_hash:
            _label_from_pod(out, node, pod, ready_key, version_ready_key)
            if pod.ready:
                out.outcomes.append(
                    NodeOutcome(node.name, Phase.LOADED, "Loaded", "", resolved.mapping_index)
                )
            else:
                unavailable += 1
                out.outcomes.append(
                    NodeOutcome(
                        node.name,
                        Phase.FAILED if pod.problem else Phase.LOADING,
                        "LoadFailed" if pod.problem else "Loading",
                        pod.problem or f"loader pod {pod.name} is starting",
                        resolved.mapping_index,
                    )
                )
            continue
        if image.state is not ImageState.EXISTS:
            if pod is not None and pod.ready and pod.kernel == node.kernel:
                # Keep the old module loaded until the new image exists.
                _label_from_pod(out, node, pod, ready_key, version_ready_key)
            out.outcomes.append(_image_outcome(node, resolved, image))
            if pod is None or not pod.ready:
                unavailable += 1
            continue
        if pod is None:
            desired = for_node(template, module, node)
            out.create.append(desired)
            unavailable += 1
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.LOADING,
                    "Loading",
                    f"creating loader pod {desired['metadata']['name']}",
                    resolved.mapping_index,
                )
            )
            continue
        if not pod.ready or pod.kernel != node.kernel:
            # Nothing useful is loaded (it never came up, or the node rebooted
            # into another kernel): replace it without spending the budget.
            _unlabel(out, node, ready_key, version_ready_key)
            out.delete.append(pod.name)
            unavailable += 1
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.UPDATING,
                    "Replacing",
                    f"replacing loader pod {pod.name}",
                    resolved.mapping_index,
                )
            )
            continue
        updates.append((node, pod, resolved))

    for pod in by_node.values():  # loader pods on nodes that no longer exist
        out.delete.append(pod.name)

    budget = max_unavailable(
        module.spec.rollout_policy().max_unavailable, out.targeted + len(updates)
    )
    # Updates already under way (label gone) finish first and count first.
    updates.sort(key=lambda u: ready_key in u[0].labels)
    for node, pod, resolved in updates:
        in_transition = ready_key not in node.labels
        if not in_transition and unavailable >= budget:
            _label_from_pod(out, node, pod, ready_key, version_ready_key)
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.UPDATING,
                    "UpdatePending",
                    f"waiting for the rollout budget (maxUnavailable {budget})",
                    resolved.mapping_index,
                )
            )
            continue
        unavailable += 1
        # Step 1: take the readiness label away so gated pods leave the node.
        _unlabel(out, node, ready_key, version_ready_key)
        holders = consumers.get(node.name)
        if in_transition and holders is None:
            out.awaiting_consumers.append(node.name)
        if not in_transition or holders is None or holders:
            out.outcomes.append(
                NodeOutcome(
                    node.name,
                    Phase.UPDATING,
                    "WaitingForConsumers",
                    (
                        "waiting for pods gated on the readiness label to leave: "
                        + ", ".join(holders)
                    )
                    if holders
                    else "readiness label removed",
                    resolved.mapping_index,
                )
            )
            continue
        # Step 2: nothing holds the module through the label any more: unload.
        out.delete.append(pod.name)
        out.outcomes.append(
            NodeOutcome(
                node.name,
                Phase.UPDATING,
                "Unloading",
                f"unloading the old module ({pod.name})",
                resolved.mapping_index,
            )
        )
    out.outcomes.sort(key=lambda o: o.node)
    return out


def _held_back(
    node: NodeView, pod: LoaderPod | None, version: str, key: str, resolved: ResolvedMapping
) -> NodeOutcome:
    have = f"version {pod.version!r} stays loaded" if pod else "nothing is loaded"
    return NodeOutcome(
        node.name,
        Phase.WAITING,
        "AwaitingVersionLabel",
        f"{have}; label the node {key}={version} to load version {version}",
        resolved.mapping_index,
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
    out: LoaderPlan, node: NodeView, pod: LoaderPod | None, ready_key: str, version_ready_key: str
) -> None:
    _unlabel(out, node, ready_key, version_ready_key)
    if pod is not None and not pod.deleting:
        out.delete.append(pod.name)


def _label_from_pod(
    out: LoaderPlan, node: NodeView, pod: LoaderPod, ready_key: str, version_ready_key: str
) -> None:
    if pod.ready and not pod.deleting and pod.kernel == node.kernel:
        want: dict[str, str | None] = {ready_key: "", version_ready_key: pod.version or None}
    else:
        want = {ready_key: None, version_ready_key: None}
    _patch(out, node, want)


def _unlabel(out: LoaderPlan, node: NodeView, ready_key: str, version_ready_key: str) -> None:
    _patch(out, node, {ready_key: None, version_ready_key: None})


def _patch(out: LoaderPlan, node: NodeView, want: Mapping[str, str | None]) -> None:
    """Record only the label changes ``node`` really needs (zero writes when converged)."""
    change = {k: v for k, v in want.items() if node.labels.get(k) != v}
    if change:
        out.node_labels.setdefault(node.name, {}).update(change)
