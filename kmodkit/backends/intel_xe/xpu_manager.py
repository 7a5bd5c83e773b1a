"""XPU Manager (resourceMonitoring: true): telemetry and GPU health for the other components.

Its OpenTelemetry configuration is generated from the policy (log level,
health thresholds) unless the policy names a ConfigMap of its own. The pods
carry the configuration's hash, so a change rolls them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from kmodkit.backends.intel_xe import settings as keys
from kmodkit.backends.intel_xe.claims import DRIVER
from kmodkit.backends.intel_xe.dra_driver import DEVICE_CLASS
from kmodkit.backends.intel_xe.openshift import scc_objects, service_account
from kmodkit.backends.intel_xe.operand import Operands, host_path
from kmodkit.sdk import Watch

APP = "intel-xpumanager"
CONFIG_KEY = "config.yaml"
HASH_ANNOTATION = "gpu.intel.com/xpum-otel-config-hash"
_LOG_LEVELS = ("error", "warn", "info", "debug")
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
ADMIN_NAMESPACES = Watch(
    name="admin-access-namespaces",
    group="",
    version="v1",
    plural="namespaces",
    labels={ADMIN_ACCESS_LABEL: "true"},
)
"""Namespaces where DRA grants admin access: XPU Manager's claim needs the operator's among them."""
ADMIN_ACCESS_MISSING = (
    "XPU Manager is not deployed: in dra mode it watches every GPU through an admin-access "
    "ResourceClaim, which needs the label {label}=true on the operator namespace {namespace}; "
    "label the namespace"
)


def name(policy: str) -> str:
    return f"{policy}-xpu-manager"


def config_map_name(policy: str) -> str:
    return f"{policy}-xpumanager-otel-config"


def claim_template_name(policy: str) -> str:
    return f"{policy}-monitor-claim"


def _temperature_rule(title: str, location: str, threshold: int) -> dict[str, Any]:
    return {
        "name": title,
        "source_metric": "hw.temperature",
        "parent_metric": "hw.gpu.info",
        "parent_filter": {"pci.vendor_id": "8086"},
        "component_filter": {"hw.sensor_location": location},
        "states": [
            {"name": "ok"},
            {"name": "critical", "conditions": [{"op": ">=", "value": float(threshold)}]},
        ],
    }


def otel_config(ops: Operands) -> dict[str, Any]:
    """The collector configuration: sample GPUs, derive health, export to the socket and :8080."""
    xpu = ops.spec.xpu
    health = ops.spec.health
    level = ops.log_level(xpu.log_level if xpu else None)
    interval = health.check_interval_seconds if health else 5
    core = health.core_temperature_threshold if health else 100
    memory = health.memory_temperature_threshold if health else 100
    return {
        "receivers": {
            "intelxpu": {
                "collection_interval": f"{interval}s",
                "initial_delay": "1s",
                "timeout": 0,
                "sampling_interval": "1s",
            }
        },
        "processors": {
            "intelxpustatus": {
                "rules": [
                    _temperature_rule("Intel GPU core temperature health", "gpu", core),
                    _temperature_rule("Intel GPU memory temperature health", "memory", memory),
                ]
            }
        },
        "exporters": {
            "intelxpuinfo": {"endpoint": "/run/xpumd/intelxpuinfo.sock"},
            "prometheus": {"endpoint": "0.0.0.0:8080"},
        },
        "service": {
            "telemetry": {"logs": {"level": _LOG_LEVELS[min(level, 3)]}},
            "pipelines": {
                "metrics": {
                    "receivers": ["intelxpu"],
                    "processors": ["intelxpustatus"],
                    "exporters": ["intelxpuinfo", "prometheus"],
                },
                "logs": {"receivers": ["intelxpu"], "exporters": ["intelxpuinfo"]},
            },
        },
    }


def manifests(ops: Operands, dra_claims: bool) -> list[dict[str, Any]]:
    """XPU Manager's objects; with ``dra_claims`` it sees the GPUs through an admin claim."""
    xpu = ops.spec.xpu
    objects: list[dict[str, Any]] = []
    override = xpu.config_map_override if xpu else None
    if override:
        # The override's content is the user's to roll; its name keys the pods.
        config_name, config_hash = override, hashlib.sha256(override.encode()).hexdigest()
    else:
        text = yaml.safe_dump(otel_config(ops), sort_keys=True)
        config_name, config_hash = (
            config_map_name(ops.policy),
            hashlib.sha256(text.encode()).hexdigest(),
        )
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": config_name,
                    "namespace": ops.namespace,
                    "labels": {"app": APP},
                },
                "data": {CONFIG_KEY: text},
            }
        )
    container: dict[str, Any] = {
        "name": "xpumd",
        "image": keys.image(
            xpu.image if xpu else None,
            ops.settings,
            keys.XPU_MANAGER_IMAGE_SETTING,
            keys.XPU_MANAGER_IMAGE,
        ),
        "imagePullPolicy": "IfNotPresent",
        "args": ["--config=/etc/xpumd/config.yaml"],
        "ports": [{"name": "http", "containerPort": 8080}],
        "resources": {
            "requests": {"cpu": "10m", "memory": "128Mi"},
            "limits": {"cpu": "100m", "memory": "512Mi"},
        },
        "securityContext": {
            "runAsUser": 0,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/xpumd", "readOnly": True},
            {"name": "rundir", "mountPath": "/run/xpumd"},
        ],
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": config_name, "defaultMode": 0o420}},
            host_path("rundir", "/run/xpumd", "DirectoryOrCreate"),
        ],
    }
    if dra_claims:
        template = claim_template_name(ops.policy)
        objects.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": template, "namespace": ops.namespace},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": DEVICE_CLASS,
                                        "adminAccess": True,
                                        "allocationMode": "All",
                                        "tolerations": [
                                            {"operator": "Exists", "effect": "NoSchedule"},
                                            {"operator": "Exists", "effect": "NoExecute"},
                                        ],
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        )
        pod["resourceClaims"] = [{"name": "monitor-claim", "resourceClaimTemplateName": template}]
        container["resources"]["claims"] = [{"name": "monitor-claim"}]
    else:
        resource = f"{DRIVER}/{xpu.monitoring_resource if xpu else 'monitoring'}"
        container["resources"]["requests"][resource] = "1"
        container["resources"]["limits"][resource] = "1"
    if ops.openshift:
        account = f"{ops.policy}-xpu-manager-sa"
        pod["serviceAccountName"] = account
        # XPU Manager reads every GPU's telemetry: container_t may not.
        container["securityContext"]["seLinuxOptions"] = {"type": "spc_t"}
        objects += [
            service_account(account, ops.namespace),
            *scc_objects(
                f"{ops.policy}-xpu-manager-scc",
                account,
                ops.namespace,
                volumes=["hostPath", "configMap"],
                capabilities=["SYS_ADMIN"],
            ),
        ]
    objects.append(ops.daemon_set(name(ops.policy), APP, pod, {HASH_ANNOTATION: config_hash}))
    return objects
