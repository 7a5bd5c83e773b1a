"""Module-loader plans: which loader pod each node should run, and its labels.

One long-running loader pod per (Module, node) holds the module loaded: its
init container copies the kernel's tree out of the module image, the node
agent loads it, answers the readiness probe from what the kernel really has
loaded, and unloads when the pod is deleted. After a reboot the kubelet
restarts the pod and the module is loaded again (KMM's most reported bug is a
node that says "ready" after a reboot with nothing loaded).

Everything the plan needs is observed state: the Module, the nodes, the loader
pods (whose annotations record the config, kernel and version they run), the
images known to exist, and, for nodes about to unload, the pods still gated on
the readiness label. The plan is a pure function; applying it twice changes
nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

import yaml

from core import labels
from core.api import Module
from core.kernel import dns_safe
from core.kernel_mapping import NoMatch, ResolvedMapping, ResolveError, resolve
from core.nodes import NodeView, blocking_taints, selector_matches

# Annotations a loader pod carries: the pod is the record of what the node runs.
CONFIG_HASH = f"{labels.KMODKIT_PREFIX}/config-hash"
KERNEL = f"{labels.KMODKIT_PREFIX}/kernel"
MODULE_VERSION = f"{labels.KMODKIT_PREFIX}/module-version"
AGENT_CONFIG = f"{labels.KMODKIT_PREFIX}/agent-config"
MODULE_LABEL = f"{labels.KMODKIT_PREFIX}/module"
COMPONENT_LABEL = "app.kubernetes.io/component"
LOADER_COMPONENT = "module-loader"

# Where the loader pod puts what it copies out of the module image.
STAGING = "/kmod"
FIRMWARE_STAGING = f"{STAGING}/firmware"
HOST_ROOT = "/host"
AGENT_CONFIG_DIR = "/etc/kmodkit"
# Firmware directories the kernel searches without being told (no sysfs write).
BUILTIN_FIRMWARE_DIRS = ("/lib/firmware", "/lib/firmware/updates")

# Loader pods stay through a cordon or a NotReady spell, as DaemonSet pods do.
TRANSIENT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
)


@dataclass(frozen=True)
class LoaderSettings:
    """Operator-wide settings of loader pods (chart values)."""

    agent_image: str
    firmware_host_path: str = "/var/lib/firmware"


@dataclass(frozen=True)
class LoaderPod:
    """A loader pod as observed."""

    name: str
    node: str
    config_hash: str
    kernel: str
    version: str
    ready: bool
    deleting: bool = False
    problem: str = ""
    """Why the pod is not ready, from its container statuses (empty when unknown)."""


def loader_pod_view(obj: Mapping[str, Any]) -> LoaderPod:
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return LoaderPod(
        name=meta.get("name", ""),
        node=(obj.get("spec") or {}).get("nodeName", ""),
        config_hash=ann.get(CONFIG_HASH, ""),
        kernel=ann.get(KERNEL, ""),
        version=ann.get(MODULE_VERSION, ""),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        problem=_pod_problem(status),
    )


def _pod_problem(status: Mapping[str, Any]) -> str:
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in (
            "PodInitializing",
            "ContainerCreating",
        ):
            return f"{cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}".strip()
        term = state.get("terminated") or {}
        if term.get("exitCode"):
            return (
                f"{cs.get('name')}: exited {term['exitCode']} "
                f"({term.get('reason', '')}) {term.get('message', '')}"
            ).strip()
    return ""


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


def pod_name(module: str, node: str) -> str:
    name = f"{module}-loader-{node}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[:242]}-{digest}"


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
    templates: dict[str, dict[str, Any]] = {}
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

        out.needed_images.setdefault(resolved.container_image, resolved)
        out.nodes_by_image.setdefault(resolved.container_image, []).append(node)
        if resolved.kernel not in templates:
            templates[resolved.kernel] = pod_template(module, resolved, settings)
        template = templates[resolved.kernel]
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


def agent_config(
    module: Module, resolved: ResolvedMapping, settings: LoaderSettings
) -> dict[str, Any]:
    """The node agent's configuration for this Module on one kernel."""
    modprobe = module.spec.module_loader.container.modprobe
    mp: dict[str, Any] = {
        "moduleName": modprobe.module_name,
        "dirName": f"{STAGING}{modprobe.dir_name}",
    }
    if modprobe.modules_loading_order:
        mp["modulesLoadingOrder"] = list(modprobe.modules_loading_order)
    if modprobe.parameters:
        mp["parameters"] = list(modprobe.parameters)
    if modprobe.args is not None:
        mp["args"] = {"load": list(modprobe.args.load), "unload": list(modprobe.args.unload)}
    if modprobe.firmware_path:
        mp["firmwarePath"] = FIRMWARE_STAGING
    return {
        "modprobe": mp,
        "inTreeModulesToRemove": list(resolved.in_tree_modules_to_remove),
        "firmwareHostPath": settings.firmware_host_path,
        # No ``version``: a KMM version is an admin's label value, not the
        # module's MODULE_VERSION. Generic Modules never defer to DKMS; a
        # backend whose driver has a DKMS package configures that itself.
        "dkmsModules": [],
        "unloadOnTerminate": True,
    }


def loader_pod(
    module: Module, node: NodeView, resolved: ResolvedMapping, settings: LoaderSettings
) -> dict[str, Any]:
    """The loader pod that keeps ``module`` loaded on ``node``."""
    return for_node(pod_template(module, resolved, settings), module, node)


def for_node(template: Mapping[str, Any], module: Module, node: NodeView) -> dict[str, Any]:
    """A pod template (shared by every node of one kernel) bound to ``node``."""
    meta = {**template["metadata"], "name": pod_name(module.metadata.name or "", node.name)}
    return {**template, "metadata": meta, "spec": {**template["spec"], "nodeName": node.name}}


def pod_template(
    module: Module, resolved: ResolvedMapping, settings: LoaderSettings
) -> dict[str, Any]:
    """Everything of a loader pod but its node: the same for all nodes of one kernel,
    so a pass over a large fleet builds (and hashes) it once per kernel."""
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    container = module.spec.module_loader.container
    modprobe = container.modprobe
    config = agent_config(module, resolved, settings)
    kernel_dir = f"{modprobe.dir_name}/lib/modules/{resolved.kernel}"
    copy = [
        f"mkdir -p {STAGING}{modprobe.dir_name}/lib/modules",
        f"cp -R {kernel_dir} {STAGING}{modprobe.dir_name}/lib/modules/",
    ]
    if modprobe.firmware_path:
        copy += [
            f"mkdir -p {FIRMWARE_STAGING}",
            f"cp -R {modprobe.firmware_path}/. {FIRMWARE_STAGING}/",
        ]
    firmware = bool(modprobe.firmware_path)
    # Writing /sys/module/firmware_class/parameters/path needs a writable
    # sysfs, i.e. a privileged container; nothing else the agent does does.
    privileged = firmware and settings.firmware_host_path not in BUILTIN_FIRMWARE_DIRS
    mounts = [
        {"name": "staging", "mountPath": STAGING, "readOnly": True},
        {"name": "config", "mountPath": AGENT_CONFIG_DIR, "readOnly": True},
        *(
            {"name": n, "mountPath": f"{HOST_ROOT}{p}", "readOnly": ro}
            for n, p, ro in _host_paths(settings, firmware, privileged)
        ),
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "staging", "emptyDir": {}},
        {
            "name": "config",
            "downwardAPI": {
                "items": [
                    {
                        "path": "agent.yaml",
                        "fieldRef": {"fieldPath": f"metadata.annotations['{AGENT_CONFIG}']"},
                    }
                ]
            },
        },
        *(
            {
                "name": n,
                "hostPath": {"path": p, "type": "DirectoryOrCreate" if not ro else "Directory"},
            }
            for n, p, ro in _host_paths(settings, firmware, privileged)
        ),
    ]
    agent = [
        "kmodkit-agent",
        "--host-root",
        HOST_ROOT,
        "--config",
        f"{AGENT_CONFIG_DIR}/agent.yaml",
    ]
    security: dict[str, Any] = (
        {"privileged": True}
        if privileged
        else {"capabilities": {"add": ["SYS_MODULE"], "drop": ["ALL"]}, "runAsUser": 0}
    )
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "serviceAccountName": module.spec.module_loader.service_account_name or "default",
        "automountServiceAccountToken": False,
        "tolerations": [
            *TRANSIENT_TOLERATIONS,
            *(
                t.model_dump(by_alias=True, exclude_none=True)
                for t in module.spec.tolerations or []
            ),
        ],
        "initContainers": [
            {
                "name": "image-extractor",
                "image": resolved.container_image,
                "imagePullPolicy": container.image_pull_policy or "IfNotPresent",
                "command": ["/bin/sh", "-c", " && ".join(copy)],
                "volumeMounts": [{"name": "staging", "mountPath": STAGING}],
                "resources": _resources(),
            }
        ],
        "containers": [
            {
                "name": "agent",
                "image": settings.agent_image,
                "command": [*agent, "run"],
                "readinessProbe": {
                    "exec": {"command": [*agent, "status"]},
                    "periodSeconds": 10,
                    "failureThreshold": 1,
                },
                "securityContext": security,
                "volumeMounts": mounts,
                "resources": _resources(),
            }
        ],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 120,
    }
    if module.spec.image_repo_secret is not None:
        spec["imagePullSecrets"] = [{"name": module.spec.image_repo_secret.name}]
    config_yaml = yaml.safe_dump(config, sort_keys=True)
    version = container.version or ""
    # The version is part of what a node runs: a bump reloads even with the same image.
    digest = hashlib.sha256(
        json.dumps([spec, config, version], sort_keys=True).encode()
    ).hexdigest()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": ns,
            "labels": {
                labels.MANAGED_BY_LABEL: labels.MANAGED_BY,
                COMPONENT_LABEL: LOADER_COMPONENT,
                MODULE_LABEL: name,
                labels.MODULE_NAME_LABEL: name,
                labels.ROLE_LABEL: labels.ROLE_MODULE_LOADER,
                labels.TARGET_KERNEL_LABEL: dns_safe(resolved.kernel)[:63].strip("-."),
            },
            "annotations": {
                CONFIG_HASH: digest[:32],
                KERNEL: resolved.kernel,
                MODULE_VERSION: version,
                AGENT_CONFIG: config_yaml,
            },
        },
        "spec": spec,
    }


def _host_paths(
    settings: LoaderSettings, firmware: bool, privileged: bool
) -> list[tuple[str, str, bool]]:
    """(volume, host path, read-only) the agent needs; /usr/src and DKMS are not read."""
    paths = [
        ("host-modules", "/lib/modules", True),
        ("host-sys", "/sys", not privileged),
        ("host-proc", "/proc", True),
        ("host-run", "/run/kmodkit", False),
    ]
    if firmware:
        paths.append(("host-firmware", settings.firmware_host_path, False))
    return paths


def _resources() -> dict[str, Any]:
    return {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
