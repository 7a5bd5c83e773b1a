"""The Intel GPU DRA driver (resourceRegistration: dra): RBAC, DeviceClasses, kubelet plugin.

The DeviceClass names are the driver's protocol (claims name them), so they
are fixed: one policy in dra mode per cluster. The admission policy confines
each kubelet plugin to the ResourceSlices of its own node; it matches every
version of ResourceSlice, not one beta version only.
"""

from __future__ import annotations

from typing import Any

from kmodkit.backends.intel_xe import settings as keys
from kmodkit.backends.intel_xe.claims import DRIVER
from kmodkit.backends.intel_xe.openshift import scc_objects
from kmodkit.backends.intel_xe.operand import Operands, field_env, host_path

APP = "intel-gpu-resource-driver-kubelet-plugin"
HEALTHCHECK_PORT = 51516
DEVICE_CLASS = "gpu.intel.com"
VFIO_DEVICE_CLASS = "gpu-vfio.intel.com"
_DRIVER_SELECTOR = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
_VFIO_SELECTOR = {
    "cel": {
        "expression": f"device.attributes[\"{DRIVER}\"].driver == 'vfio-pci' "
        f"|| device.attributes[\"{DRIVER}\"].driver == 'xe-vfio-pci'"
    }
}


_NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def name(policy: str) -> str:
    return f"{policy}-gpu-dra"


def args(ops: Operands) -> list[str]:
    dra = ops.spec.dra
    out = [f"-v={ops.log_level(dra.log_level if dra else None)}"]
    if ops.spec.health is not None:
        out.append("--health-monitoring=true")
    health_check = dra.pod_health_check if dra else True
    out.append(f"--healthcheck-port={HEALTHCHECK_PORT if health_check else -1}")
    out.append(f"--manage-binding={'true' if dra and dra.manage_binding else 'false'}")
    return out


def device_classes(manage_binding: bool) -> list[dict[str, Any]]:
    vfio = [_DRIVER_SELECTOR] if manage_binding else [_DRIVER_SELECTOR, _VFIO_SELECTOR]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [_DRIVER_SELECTOR], "extendedResourceName": "intel.com/gpu"},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": VFIO_DEVICE_CLASS},
            "spec": {"selectors": vfio},
        },
    ]


def _rbac(ops: Operands) -> list[dict[str, Any]]:
    n = name(ops.policy)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": n, "namespace": ops.namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": n},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims"],
                    "verbs": ["get"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": n},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": n},
            "subjects": [{"kind": "ServiceAccount", "name": n, "namespace": ops.namespace}],
        },
    ]


def _slice_policy(ops: Operands) -> list[dict[str, Any]]:
    n = name(ops.policy)
    user = f"system:serviceaccount:{ops.namespace}:{n}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": n},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": ["resourceslices"],
                    }
                ]
            },
            "matchConditions": [
                {"name": "isRestrictedUser", "expression": f'request.userInfo.username == "{user}"'}
            ],
            "variables": [
                {
                    "name": "userNodeName",
                    "expression": f"'{_NODE_NAME_EXTRA}' in request.userInfo.extra "
                    f"? request.userInfo.extra['{_NODE_NAME_EXTRA}'][0] : ''",
                },
                {
                    "name": "objectNodeName",
                    "expression": "request.operation == 'DELETE' "
                    "? (has(oldObject.spec.nodeName) ? oldObject.spec.nodeName : '') "
                    ": (has(object.spec.nodeName) ? object.spec.nodeName : '')",
                },
            ],
            "validations": [
                {
                    "expression": "variables.userNodeName != ''",
                    "message": "the DRA driver's service account may change ResourceSlices only "
                    "from a pod bound to a node (no node name in its token)",
                },
                {
                    "expression": "variables.userNodeName == variables.objectNodeName",
                    "messageExpression": "'the DRA driver on node ' + variables.userNodeName + "
                    "' may only change ResourceSlices of its own node, not of node ' + "
                    "variables.objectNodeName",
                },
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": n},
        "spec": {"policyName": n, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def manifests(ops: Operands) -> list[dict[str, Any]]:
    dra = ops.spec.dra
    n = name(ops.policy)
    container: dict[str, Any] = {
        "name": "kubelet-plugin",
        "image": keys.image(
            dra.image if dra else None, ops.settings, keys.DRA_IMAGE_SETTING, keys.DRA_IMAGE
        ),
        "imagePullPolicy": "IfNotPresent",
        "command": ["/kubelet-gpu-plugin"],
        "args": args(ops),
        "env": [
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            {"name": "SYSFS_ROOT", "value": "/sysfs"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "plugins-registry", "mountPath": "/var/lib/kubelet/plugins_registry"},
            {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins"},
            {"name": "cdi", "mountPath": "/etc/cdi"},
            {"name": "varruncdi", "mountPath": "/var/run/cdi"},
            {"name": "xpumdrundir", "mountPath": "/run/xpumd"},
            {"name": "sysfs", "mountPath": "/sysfs"},
        ],
    }
    if dra is None or dra.pod_health_check:
        probe = {"grpc": {"port": HEALTHCHECK_PORT, "service": "liveness"}, "timeoutSeconds": 10}
        container["ports"] = [{"name": "healthcheck", "containerPort": HEALTHCHECK_PORT}]
        container["startupProbe"] = {**probe, "failureThreshold": 60, "periodSeconds": 10}
        container["livenessProbe"] = {**probe, "failureThreshold": 3, "periodSeconds": 30}
    pod = {
        "serviceAccountName": n,
        "containers": [container],
        "volumes": [
            host_path("plugins-registry", "/var/lib/kubelet/plugins_registry"),
            host_path("plugins", "/var/lib/kubelet/plugins"),
            host_path("cdi", "/etc/cdi"),
            host_path("varruncdi", "/var/run/cdi"),
            host_path("xpumdrundir", "/run/xpumd", "DirectoryOrCreate"),
            host_path("sysfs", "/sys"),
        ],
    }
    scc = (
        scc_objects(scc_name(ops.policy), n, ops.namespace, volumes=["hostPath", "projected"])
        if ops.openshift
        else []
    )
    return [
        *_rbac(ops),
        *scc,
        *device_classes(bool(dra and dra.manage_binding)),
        *_slice_policy(ops),
        ops.daemon_set(n, APP, pod),
    ]


def scc_name(policy: str) -> str:
    return f"{policy}-gpu-dra-scc"
