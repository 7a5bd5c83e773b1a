"""The Intel GPU device plugin DaemonSet (resourceRegistration: dp)."""

from __future__ import annotations

from typing import Any

from kmodkit.backends.intel_xe import settings as keys
from kmodkit.backends.intel_xe.openshift import scc_objects, service_account
from kmodkit.backends.intel_xe.operand import Operands, field_env, host_path

APP = "intel-gpu-plugin"
XPUMD_SOCKET = "/run/xpumd/intelxpuinfo.sock"


def name(policy: str) -> str:
    return f"{policy}-device-plugin"


def _ids(ids: list[str]) -> str:
    return ",".join(i if i.startswith("0x") else f"0x{i}" for i in ids)


def args(ops: Operands) -> list[str]:
    dp = ops.spec.dp
    out = []
    if ops.spec.resource_monitoring:
        out += ["-enable-monitoring", f"-xpumd-endpoint={XPUMD_SOCKET}"]
    if (level := ops.log_level(dp.log_level if dp else None)) > 0:
        out.append(f"-v={level}")
    if dp is not None:
        if dp.by_path_mode:
            out.append(f"-bypath={dp.by_path_mode}")
        if dp.allow_ids:
            out.append(f"-allow-ids={_ids(dp.allow_ids)}")
        if dp.deny_ids:
            out.append(f"-deny-ids={_ids(dp.deny_ids)}")
    return out


def manifests(ops: Operands) -> list[dict[str, Any]]:
    dp = ops.spec.dp
    mounts = [
        {"name": "devfs", "mountPath": "/dev/dri", "readOnly": True},
        {"name": "sysfsdrm", "mountPath": "/sys/class/drm", "readOnly": True},
        {"name": "kubeletsockets", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "cdipath", "mountPath": "/var/run/cdi"},
    ]
    volumes = [
        host_path("devfs", "/dev/dri"),
        host_path("sysfsdrm", "/sys/class/drm"),
        host_path("kubeletsockets", "/var/lib/kubelet/device-plugins"),
        host_path("cdipath", "/var/run/cdi", "DirectoryOrCreate"),
    ]
    if ops.spec.resource_monitoring:
        mounts.append({"name": "runxpumd", "mountPath": "/run/xpumd"})
        volumes.append(host_path("runxpumd", "/run/xpumd", "DirectoryOrCreate"))
    container = {
        "name": APP,
        "image": keys.image(
            dp.plugin if dp else None,
            ops.settings,
            keys.DEVICE_PLUGIN_IMAGE_SETTING,
            keys.DEVICE_PLUGIN_IMAGE,
        ),
        "imagePullPolicy": "IfNotPresent",
        "args": args(ops),
        "env": [field_env("NODE_NAME", "spec.nodeName"), field_env("HOST_IP", "status.hostIP")],
        "resources": {
            "requests": {"cpu": "40m", "memory": "45Mi"},
            "limits": {"cpu": "100m", "memory": "90Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "seLinuxOptions": {"type": "container_device_plugin_t"},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
    }
    if not ops.openshift:
        return [ops.daemon_set(name(ops.policy), APP, pod)]
    account = f"{ops.policy}-gpu-dp-sa"
    pod["serviceAccountName"] = account
    return [
        service_account(account, ops.namespace),
        *scc_objects(
            f"{ops.policy}-gpu-dp-scc", account, ops.namespace, volumes=["hostPath", "emptyDir"]
        ),
        ops.daemon_set(name(ops.policy), APP, pod),
    ]
