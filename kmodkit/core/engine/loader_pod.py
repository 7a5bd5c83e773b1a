"""The loader pod: what runs on a node to keep a Module's kernel module loaded.

Its init container copies ``<dirName>/lib/modules/<kernel>`` (and the
firmware) out of the module image; the ``kmodkit-agent`` container loads it,
answers the readiness probe from what the kernel really has loaded, and unloads
when the pod is deleted. The pod's annotations record what it runs, so the pod
itself is the node's state (no internal per-node object as in KMM).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from kmodkit.agent.config import AgentConfig, ModprobeArgs, ModprobeConfig
from kmodkit.core import labels
from kmodkit.core.api import ModprobeSpec, Module
from kmodkit.core.engine.kernel_mapping import CONTAINER_PATH, ResolvedMapping
from kmodkit.core.kernel import dns_safe
from kmodkit.core.nodes import NodeView

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


def pod_name(module: str, node: str) -> str:
    name = f"{module}-loader-{node}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[:242]}-{digest}"


class AgentConfigError(ValueError):
    """The Module asks for a configuration the node agent would refuse.

    Admission (the CRD's rules) rejects such a Module; one that reaches the
    engine anyway gets a node failure instead of a loader pod whose agent can
    only exit.
    """


def agent_config(
    module: Module, resolved: ResolvedMapping, settings: LoaderSettings
) -> AgentConfig:
    """The node agent's configuration for this Module on one kernel."""
    return AgentConfig(
        modprobe=_modprobe(module.spec.module_loader.container.modprobe),
        in_tree_modules_to_remove=list(resolved.in_tree_modules_to_remove),
        firmware_host_path=settings.firmware_host_path,
        # No ``version``: a KMM version is an admin's label value, not the
        # module's MODULE_VERSION. Generic Modules never defer to DKMS; a
        # backend whose driver has a DKMS package configures that itself.
        dkms_modules=[],
        unload_on_terminate=True,
    )


def _modprobe(spec: ModprobeSpec) -> ModprobeConfig:
    """The Module's modprobe settings as the agent takes them, with paths inside the
    staging directory the init container fills."""
    try:
        return ModprobeConfig(
            module_name=spec.module_name,
            dir_name=f"{STAGING}{spec.dir_name}",
            parameters=list(spec.parameters or []),
            args=_args(spec),
            firmware_path=FIRMWARE_STAGING if spec.firmware_path else None,
            modules_loading_order=(
                list(spec.modules_loading_order) if spec.modules_loading_order else None
            ),
        )
    except ValidationError as err:
        # The rest of the configuration is the operator's own: only what the
        # Module gives here can be wrong, so name the Module's fields.
        path = f"{CONTAINER_PATH}.modprobe"
        raise AgentConfigError(
            "; ".join(
                f"{'.'.join([path, *(to_camel(str(p)) for p in e['loc'])])}: {e['msg']}"
                for e in err.errors()
            )
        ) from err


def _args(spec: ModprobeSpec) -> ModprobeArgs:
    if spec.args is None:
        return ModprobeArgs()
    return ModprobeArgs(load=list(spec.args.load), unload=list(spec.args.unload))


def config_document(config: AgentConfig) -> dict[str, Any]:
    """The configuration as loader pods carry it, and as their config hash covers it.

    The keys are those loader pods have always had, so an operator upgrade
    keeps every pod's hash: every top-level setting the operator decides, even
    one equal to the agent's default, and of ``modprobe`` only what differs
    from the agent's defaults, which is what the Module gives. A field the
    agent gains later stays out until the operator sets it.
    """
    document = config.model_dump(mode="json", by_alias=True, exclude_unset=True)
    document["modprobe"] = config.modprobe.model_dump(
        mode="json", by_alias=True, exclude_defaults=True
    )
    return document


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
    so a pass over a large fleet builds (and hashes) it once per kernel.

    Raises AgentConfigError for a Module the node agent would refuse.
    """
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    container = module.spec.module_loader.container
    modprobe = container.modprobe
    config = config_document(agent_config(module, resolved, settings))
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
