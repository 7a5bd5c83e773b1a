"""The loader pod: what runs on a node to keep a Module's kernel module loaded.

Its init containers copy ``<dirName>/lib/modules/<kernel>`` (and the
firmware) out of the module image; the ``kmodkit-agent`` container loads it,
answers the readiness probe from what the kernel really has loaded, and loads
it again if it vanishes. Deleting a loader pod never unloads anything: an
unload is always an unloader pod (``unload_pod``), created on purpose, whose
success is the proof that the node has nothing loaded. The pods' annotations
record what they run, so the pods themselves are the node's state (no internal
per-node object as in KMM).

Two hashes tell changes apart: the module hash covers what the kernel loads
(image, modprobe settings, parameters, firmware, in-tree removals, version);
the config hash covers the whole pod. A change of the first reloads the
driver; a change of only the second (the agent image, tolerations, resources)
gives the node a new loader pod that adopts the loaded module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from sys import intern
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from kmodkit.agent.config import AgentConfig, ModprobeArgs, ModprobeConfig
from kmodkit.agent.errors import ExitCode
from kmodkit.agent.readiness import READY_PATH
from kmodkit.agent.staging import STAGING_ENV, STAGING_ROOT
from kmodkit.core import labels
from kmodkit.core.api import ModprobeSpec, Module
from kmodkit.core.api.module import MODULE_NAME_MSG
from kmodkit.core.engine.kernel_mapping import CONTAINER_PATH, ResolvedMapping
from kmodkit.core.kernel import dns_safe
from kmodkit.core.nodes import NodeView

# Annotations a loader pod carries: the pod is the record of what the node runs.
CONFIG_HASH = f"{labels.KMODKIT_PREFIX}/config-hash"
MODULE_HASH = f"{labels.KMODKIT_PREFIX}/module-hash"
"""Present on loader pods that leave the module loaded when deleted (all but the oldest)."""
KERNEL = f"{labels.KMODKIT_PREFIX}/kernel"
MODULE_VERSION = f"{labels.KMODKIT_PREFIX}/module-version"
AGENT_CONFIG = f"{labels.KMODKIT_PREFIX}/agent-config"
MODULE_LABEL = f"{labels.KMODKIT_PREFIX}/module"
COMPONENT_LABEL = "app.kubernetes.io/component"
LOADER_COMPONENT = "module-loader"
UNLOADER_COMPONENT = "module-unloader"
AGENT_CONTAINER = "agent"
# Loader pods keep a node's driver: the kubelet must not evict or preempt them
# before the workloads that use it (allowed in every namespace since 1.17).
PRIORITY_CLASS = "system-node-critical"

# Where the loader pod puts what it copies out of the module image.
STAGING = "/kmod"
FIRMWARE_STAGING = f"{STAGING}/firmware"
HOST_ROOT = "/host"
AGENT_CONFIG_DIR = "/etc/kmodkit"
# Firmware directories the kernel searches without being told (no sysfs write).
BUILTIN_FIRMWARE_DIRS = ("/lib/firmware", "/lib/firmware/updates")

# What loading a module takes: CAP_SYS_MODULE, and on SELinux hosts (RHEL,
# OpenShift) the spc_t type, as container_t may not load modules; hosts without
# SELinux ignore the type.
MODULE_LOADING: Mapping[str, Any] = {
    "capabilities": {"add": ["SYS_MODULE"], "drop": ["ALL"]},
    "runAsUser": 0,
    "seLinuxOptions": {"type": "spc_t"},
}
# Copying out of the image into the host's staging directory: root, as the
# kubelet made that directory; spc_t, as container_t may not write host paths.
EXTRACTING: Mapping[str, Any] = {
    "capabilities": {"drop": ["ALL"]},
    "allowPrivilegeEscalation": False,
    "runAsUser": 0,
    "seLinuxOptions": {"type": "spc_t"},
}
# The cluster autoscaler may remove a node whatever runs there: the pods hold
# no data (their copies of the image live on the host, see kmodkit.agent.staging).
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
POD_UID_ENV = "KMODKIT_POD_UID"
FIRMWARE_EXTRACTOR = "firmware-extractor"
# The agent's readiness answer, on the pod's own network address.
READINESS_PORT = 8095

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
    """A loader (or unloader) pod as observed."""

    name: str
    node: str
    config_hash: str
    kernel: str
    version: str
    ready: bool
    deleting: bool = False
    problem: str = ""
    """Why the pod is not ready, from its container statuses (empty when unknown)."""
    module_hash: str = ""
    leaves_loaded: bool = False
    """Deleting the pod leaves its module loaded (pods older than that unload on SIGTERM)."""
    uid: str = ""
    created: str = ""
    phase: str = "Running"
    restarts: int = 0
    unloader: bool = False
    agent_config: str = ""
    """The agent configuration the pod runs (YAML), for the unloader that follows it."""
    image: str = ""
    """The module image its init container copies from."""
    firmware_source: str = ""
    """The image's firmware directory its init container copies (empty: none)."""
    agent_exit_code: int = 0
    """How the agent container last ended (0: it has not ended, or succeeded)."""
    agent_message: str = ""
    """The agent's termination message from that run (its failure, in its own words)."""

    @property
    def ended(self) -> bool:
        """The pod's containers will not run again (the kubelet gave up on it, or it finished)."""
        return self.phase in ("Succeeded", "Failed")


def loader_pod_view(obj: Mapping[str, Any]) -> LoaderPod:
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    recorded = ann.get(MODULE_HASH)
    # A Module's pods share their hashes, kernels, configuration and images: interned,
    # the cache keeps each once, not once per pod of the fleet (see kmodkit.core.interned).
    return LoaderPod(
        name=meta.get("name", ""),
        node=spec.get("nodeName", ""),
        config_hash=intern(ann.get(CONFIG_HASH, "")),
        kernel=intern(ann.get(KERNEL, "")),
        version=intern(ann.get(MODULE_VERSION, "")),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        problem=_pod_problem(status),
        module_hash=intern(recorded or _recorded_module(spec, ann)),
        leaves_loaded=recorded is not None,
        uid=meta.get("uid", ""),
        created=str(meta.get("creationTimestamp") or ""),
        phase=intern(status.get("phase") or "Pending"),
        restarts=sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or []),
        unloader=(meta.get("labels") or {}).get(COMPONENT_LABEL) == UNLOADER_COMPONENT,
        agent_config=intern(ann.get(AGENT_CONFIG, "")),
        image=intern(((spec.get("initContainers") or [{}])[0]).get("image", "")),
        firmware_source=intern(_copied_firmware(spec)),
        **_agent_ended(status),
    )


def _copied_firmware(spec: Mapping[str, Any]) -> str:
    """The firmware directory the pod's firmware extractor copies out of the image."""
    for init in spec.get("initContainers") or []:
        command = init.get("command") or []
        if init.get("name") == FIRMWARE_EXTRACTOR and len(command) == 4:
            return str(command[2]).removesuffix("/.")
    return ""


def _recorded_module(spec: Mapping[str, Any], ann: Mapping[str, str]) -> str:
    """The module hash of a pod made before pods recorded it, from what it runs."""
    init = spec.get("initContainers") or [{}]
    try:
        config = yaml.safe_load(ann.get(AGENT_CONFIG, "")) or {}
    except yaml.YAMLError:
        return ""
    return module_identity(init[0].get("image", ""), config, ann.get(MODULE_VERSION, ""))


def module_identity(image: str, config: Mapping[str, Any], version: str) -> str:
    """What the kernel ends up running: the module image, how the agent loads it, the version."""
    loads = {k: config.get(k) for k in ("modprobe", "inTreeModulesToRemove", "firmwareHostPath")}
    return hashlib.sha256(json.dumps([image, loads, version], sort_keys=True).encode()).hexdigest()[
        :32
    ]


def _agent_ended(status: Mapping[str, Any]) -> dict[str, Any]:
    """The agent container's last exit: its code is the agent's contract (ExitCode)."""
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != AGENT_CONTAINER:
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
            "terminated"
        )
        if term:
            return {
                "agent_exit_code": int(term.get("exitCode") or 0),
                "agent_message": str(term.get("message") or "").strip(),
            }
    return {}


SIGNATURE_REJECTED = "SignatureRejected"
LOAD_FAILED = "LoadFailed"


def load_failure(pod: LoaderPod) -> tuple[str, str]:
    """The reason and message of a node whose loader pod is failing."""
    if pod.agent_exit_code == ExitCode.SIGNATURE_REJECTED:
        # The agent's message names the module, its signer and what to do: it is the
        # message, not the container's state around it.
        return SIGNATURE_REJECTED, pod.agent_message or pod.problem
    return LOAD_FAILED, pod.problem


def _pod_problem(status: Mapping[str, Any]) -> str:
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        # A container restarting (CrashLoopBackOff) said why in its last run.
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if waiting.get("reason") and waiting["reason"] not in (
            "PodInitializing",
            "ContainerCreating",
        ):
            said = last.get("message") or waiting.get("message", "")
            return f"{cs.get('name')}: {waiting['reason']}: {said}".strip()
        term = state.get("terminated") or last
        if term.get("exitCode"):
            return (
                f"{cs.get('name')}: exited {term['exitCode']} "
                f"({term.get('reason', '')}) {term.get('message', '')}"
            ).strip()
    return ""


def pod_name(module: str, node: str, after: str = "", role: str = "loader") -> str:
    """The name of the pod following the pod whose UID is ``after`` (none: the first).

    Derived from what is observed, so a pass repeated after a crash asks for the
    same pod again (and is told it exists) instead of making a second one.
    """
    base = f"{module}-{role}-{node}"
    suffix = f"-{hashlib.sha256(after.encode()).hexdigest()[:6]}" if after else ""
    if len(base) + len(suffix) <= 253:
        return base + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{base[: 242 - len(suffix)]}-{digest}{suffix}"


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
    container = module.spec.loader.container
    # Only when given: a Module without it keeps its pods' configuration hash.
    devices = {"device_paths": list(container.device_paths)} if container.device_paths else {}
    return AgentConfig(
        modprobe=_modprobe(container.modprobe),
        in_tree_modules_to_remove=list(resolved.in_tree_modules_to_remove),
        firmware_host_path=settings.firmware_host_path,
        # No ``version``: a KMM version is an admin's label value, not the
        # module's MODULE_VERSION. Generic Modules never defer to DKMS; a
        # backend whose driver has a DKMS package configures that itself.
        dkms_modules=[],
        # A deleted loader pod leaves the module loaded: only an unloader
        # pod unloads, so a drain, an eviction or an operator upgrade never does.
        unload_on_terminate=False,
        **devices,
    )


def _modprobe(spec: ModprobeSpec) -> ModprobeConfig:
    """The Module's modprobe settings as the agent takes them, with paths inside the
    staging directory the init container fills."""
    path = f"{CONTAINER_PATH}.modprobe"
    staged = f"{STAGING}{spec.dir_name}"
    raw = None
    if spec.raw_args is not None:
        raw = ModprobeArgs(
            load=_staged(spec.raw_args.load, spec.dir_name, f"{path}.rawArgs.load"),
            unload=_staged(spec.raw_args.unload, spec.dir_name, f"{path}.rawArgs.unload"),
        )
    name = spec.module_name or (raw_module_name(spec.raw_args.load) if spec.raw_args else None)
    if not name and spec.raw_args is None:
        raise AgentConfigError(f"{path}.moduleName: {MODULE_NAME_MSG}")
    if not name:
        raise AgentConfigError(
            f"{path}.rawArgs.load: names no module (its first argument that is not an "
            "option); the agent verifies that module is loaded"
        )
    try:
        return ModprobeConfig(
            module_name=name,
            dir_name=staged,
            parameters=list(spec.parameters or []),
            args=_args(spec),
            firmware_path=FIRMWARE_STAGING if spec.firmware_path else None,
            modules_loading_order=(
                list(spec.modules_loading_order) if spec.modules_loading_order else None
            ),
            raw_args=raw,
        )
    except ValidationError as err:
        # The rest of the configuration is the operator's own: only what the
        # Module gives here can be wrong, so name the Module's fields.
        raise AgentConfigError(
            "; ".join(
                f"{'.'.join([path, *(to_camel(str(p)) for p in e['loc'])])}: {e['msg']}"
                for e in err.errors()
            )
        ) from err


# modprobe options that take the next argument as their value.
_VALUE_OPTIONS = frozenset({"-d", "--dirname", "-C", "--config", "-S", "--set-version"})


def raw_module_name(args: Sequence[str]) -> str | None:
    """The module a rawArgs command line loads: its first argument that is not an option."""
    words = iter(args)
    for word in words:
        if word in _VALUE_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _staged(args: Sequence[str], dir_name: str, path: str) -> list[str]:
    """``args`` with modprobe's module directory moved into the staging directory, where
    the loader pod has the image's modules; without -d, the staging directory is given."""
    out: list[str] = []
    words = iter(args)
    given = False
    for word in words:
        value = next(words, "") if word in ("-d", "--dirname") else None
        if word.startswith("--dirname="):
            value = word.removeprefix("--dirname=")
        if value is None:
            out.append(word)
            continue
        if value != dir_name:
            raise AgentConfigError(
                f"{path}: -d {value}: the loader pod has the image's modules only under "
                f"modprobe.dirName ({dir_name}); use that directory or set dirName to {value}"
            )
        out += ["-d", f"{STAGING}{dir_name}"]
        given = True
    return out if given else ["-d", f"{STAGING}{dir_name}", *out]


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


def for_node(
    template: Mapping[str, Any], module: Module, node: NodeView, after: str = ""
) -> dict[str, Any]:
    """A pod template (shared by every node of one kernel) bound to ``node``, following
    the pod whose UID is ``after``."""
    meta = {**template["metadata"], "name": pod_name(module.metadata.name or "", node.name, after)}
    return {**template, "metadata": meta, "spec": {**template["spec"], "nodeName": node.name}}


def pod_template(
    module: Module, resolved: ResolvedMapping, settings: LoaderSettings
) -> dict[str, Any]:
    """Everything of a loader pod but its node: the same for all nodes of one kernel,
    so a pass over a large fleet builds (and hashes) it once per kernel.

    Raises AgentConfigError for a Module the node agent would refuse.
    """
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    container = module.spec.loader.container
    modprobe = container.modprobe
    config = config_document(agent_config(module, resolved, settings))
    firmware = bool(modprobe.firmware_path)
    firmware_host = settings.firmware_host_path if firmware else None
    # Writing /sys/module/firmware_class/parameters/path needs a writable
    # sysfs, i.e. a privileged container; nothing else the agent does does.
    privileged = firmware and settings.firmware_host_path not in BUILTIN_FIRMWARE_DIRS
    # The agent finds the modules where modprobe.dirName says, inside the
    # staging directory; depmod may write modules.dep there (it is a copy).
    copy = _copy(ns, name)
    mounts = [
        _staging_mount(
            f"{STAGING}{modprobe.dir_name}/lib/modules/{resolved.kernel}", f"{copy}/modules"
        ),
        *_agent_mounts(_host_paths(firmware_host, privileged=privileged)),
    ]
    pull = container.image_pull_policy or ""
    source = f"{modprobe.dir_name}/lib/modules/{resolved.kernel}"
    extract = [
        _extractor("image-extractor", resolved.container_image, pull, source, f"{copy}/modules")
    ]
    if modprobe.firmware_path:
        mounts.append({**_staging_mount(FIRMWARE_STAGING, f"{copy}/firmware"), "readOnly": True})
        extract.append(
            _extractor(
                FIRMWARE_EXTRACTOR,
                resolved.container_image,
                pull,
                modprobe.firmware_path,
                f"{copy}/firmware",
            )
        )
    volumes = _agent_volumes(_host_paths(firmware_host, privileged=privileged))
    agent = list(AGENT_COMMAND)
    security = {"privileged": True} if privileged else module_loading(config)
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "serviceAccountName": module.spec.loader.service_account_name or "default",
        "automountServiceAccountToken": False,
        "tolerations": [*TRANSIENT_TOLERATIONS, *module.spec.pod_tolerations()],
        "priorityClassName": PRIORITY_CLASS,
        "initContainers": extract,
        "containers": [
            {
                "name": AGENT_CONTAINER,
                "image": settings.agent_image,
                "command": [*agent, "run", "--readiness-port", str(READINESS_PORT)],
                "ports": [{"name": "readiness", "containerPort": READINESS_PORT}],
                # The agent answers from its loop's last look at the kernel (no
                # process per probe); three misses in a row, each given 5 s, so one
                # slow answer never takes the label (and the device plugin) away.
                "readinessProbe": {
                    "httpGet": {"path": READY_PATH, "port": "readiness"},
                    "periodSeconds": 10,
                    "timeoutSeconds": 5,
                    "failureThreshold": 3,
                },
                "env": _copy_env(copy),
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
                MODULE_HASH: module_identity(resolved.container_image, config, version),
                KERNEL: resolved.kernel,
                MODULE_VERSION: version,
                AGENT_CONFIG: config_yaml,
                SAFE_TO_EVICT: "true",
            },
        },
        "spec": spec,
    }


def unload_pod(
    module: Module, loader: LoaderPod, settings: LoaderSettings, after: str
) -> dict[str, Any]:
    """The pod that unloads what ``loader`` (or the unloader before it) loaded on its node.

    It runs ``kmodkit-agent unload`` with the loader's own configuration. It
    copies from the module image only what the unload reads: the modules when it
    runs ``modprobe -r`` (which reads their modules.dep), the firmware (its files
    are removed from the host); otherwise a registry that lost the image cannot
    keep a driver loaded. It restarts (with the kubelet's back-off)
    until the unload succeeds; each failed try leaves its reason (who holds
    the device) as the container's termination message. It tolerates every
    taint: it goes where a driver is loaded, whatever the node's state.
    """
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    config = _loaded_config(loader)
    modprobe = config.get("modprobe") or {}
    firmware_host = str(
        config.get("firmwareHostPath") or AgentConfig.model_fields["firmware_host_path"].default
    )
    firmware = bool(loader.image and loader.firmware_source and modprobe.get("firmwarePath"))
    host = _host_paths(firmware_host if firmware else None, privileged=False)
    mounts = _agent_mounts(host)
    volumes = _agent_volumes(host)
    init = []
    copy = _copy(ns, name)
    if loader.image and (modprobe.get("rawArgs") or (modprobe.get("args") or {}).get("unload")):
        # modprobe -r (rawArgs.unload, args.unload) reads the image's modules.dep.
        staged = str(modprobe.get("dirName"))
        mounts.append(_staging_mount(f"{staged}/lib/modules/{loader.kernel}", f"{copy}/modules"))
        source = f"{staged.removeprefix(STAGING)}/lib/modules/{loader.kernel}"
        init.append(_extractor("image-extractor", loader.image, "", source, f"{copy}/modules"))
    if firmware:
        # The agent removes from the host exactly the files the image ships.
        mounts.append({**_staging_mount(FIRMWARE_STAGING, f"{copy}/firmware"), "readOnly": True})
        init.append(
            _extractor(
                FIRMWARE_EXTRACTOR, loader.image, "", loader.firmware_source, f"{copy}/firmware"
            )
        )
    spec: dict[str, Any] = {
        "nodeName": loader.node,
        "restartPolicy": "OnFailure",
        "priorityClassName": PRIORITY_CLASS,
        # The Module may no longer say (its moduleLoader removed): the default account.
        "serviceAccountName": (
            module.spec.module_loader and module.spec.module_loader.service_account_name
        )
        or "default",
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": AGENT_CONTAINER,
                "image": settings.agent_image,
                "command": [*AGENT_COMMAND, "unload", "--host-managed-ok"],
                # On success it removes the module's copies of the image from the host.
                "env": _copy_env(copy),
                "securityContext": module_loading(config),
                "volumeMounts": mounts,
                "resources": _resources(),
            }
        ],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 30,
    }
    if init:
        spec["initContainers"] = init
    if module.spec.image_repo_secret is not None:
        spec["imagePullSecrets"] = [{"name": module.spec.image_repo_secret.name}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, loader.node, after, role="unload"),
            "namespace": ns,
            "labels": {
                labels.MANAGED_BY_LABEL: labels.MANAGED_BY,
                COMPONENT_LABEL: UNLOADER_COMPONENT,
                MODULE_LABEL: name,
                labels.MODULE_NAME_LABEL: name,
            },
            "annotations": {
                KERNEL: loader.kernel,
                AGENT_CONFIG: loader.agent_config,
                SAFE_TO_EVICT: "true",
            },
        },
        "spec": spec,
    }


def _loaded_config(loader: LoaderPod) -> dict[str, Any]:
    """The agent configuration ``loader`` ran with, as its annotation records it."""
    try:
        config = yaml.safe_load(loader.agent_config)
    except yaml.YAMLError:
        return {}
    return config if isinstance(config, dict) else {}


def _extractor(name: str, image: str, pull_policy: str, source: str, target: str) -> dict[str, Any]:
    """An init container copying ``source`` out of the module image into ``target`` (in
    the host's staging directory): argv only, no shell, so no path or kernel string is
    ever interpreted; copying ``source/.`` into it is the same on every restart."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": pull_policy or "IfNotPresent",
        "command": ["cp", "-R", f"{source}/.", "/staging/"],
        "env": [_POD_UID],
        "securityContext": dict(EXTRACTING),
        "volumeMounts": [_staging_mount("/staging", target)],
        "resources": _resources(),
    }


_POD_UID = {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}


def _copy(ns: str, name: str) -> str:
    """This pod's copy of the image, under the host's staging directory (one per pod:
    a successor's copy never overwrites what its predecessor still serves from)."""
    return f"{ns}.{name}/$({POD_UID_ENV})"


def _staging_mount(mount_path: str, sub_path: str) -> dict[str, Any]:
    return {"name": "staging", "mountPath": mount_path, "subPathExpr": sub_path}


def _copy_env(copy: str) -> list[dict[str, Any]]:
    """Where the agent finds its pod's copy on the host (kmodkit.agent.staging)."""
    return [_POD_UID, {"name": STAGING_ENV, "value": f"{STAGING_ROOT}/{copy}"}]


AGENT_COMMAND = (
    "kmodkit-agent",
    "--host-root",
    HOST_ROOT,
    "--config",
    f"{AGENT_CONFIG_DIR}/agent.yaml",
)


def _agent_mounts(host: list[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    """The agent's configuration and the host paths it reads or writes."""
    return [
        {"name": "config", "mountPath": AGENT_CONFIG_DIR, "readOnly": True},
        *({"name": n, "mountPath": f"{HOST_ROOT}{p}", "readOnly": ro} for n, p, ro in host),
    ]


def _agent_volumes(host: list[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    config_item = {
        "path": "agent.yaml",
        "fieldRef": {"fieldPath": f"metadata.annotations['{AGENT_CONFIG}']"},
    }
    return [
        {"name": "config", "downwardAPI": {"items": [config_item]}},
        *(
            {"name": n, "hostPath": {"path": p, "type": "Directory" if ro else "DirectoryOrCreate"}}
            for n, p, ro in host
        ),
    ]


def _host_paths(firmware_host: str | None, *, privileged: bool) -> list[tuple[str, str, bool]]:
    """(volume, host path, read-only) the agent needs, with the firmware directory when
    ``firmware_host`` says which; /usr/src and DKMS are not read."""
    paths = [
        ("host-modules", "/lib/modules", True),
        ("host-sys", "/sys", not privileged),
        ("host-proc", "/proc", True),
        ("host-run", "/run/kmodkit", False),
        # The copies of module images (kmodkit.agent.staging); init containers and the
        # agent's own copies mount parts of it.
        ("staging", STAGING_ROOT, False),
    ]
    if firmware_host is not None:
        paths.append(("host-firmware", firmware_host, False))
    return paths


def module_loading(config: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's security context: SYS_MODULE, and SYS_PTRACE when the configuration
    names device paths, to read which processes hold them (other processes' /proc/<pid>/fd,
    through the host's /proc; it signals none of them)."""
    if not config.get("devicePaths"):
        return dict(MODULE_LOADING)
    return {
        **MODULE_LOADING,
        "capabilities": {"add": ["SYS_MODULE", "SYS_PTRACE"], "drop": ["ALL"]},
    }


def _resources() -> dict[str, Any]:
    return {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
