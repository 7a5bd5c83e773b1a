"""On OpenShift, the SecurityContextConstraints each GPU component needs, as Intel's operator
makes them: one SCC per component, usable only by that component's ServiceAccount, allowing no
more than its pods ask for.

OpenShift admits a pod only under an SCC its ServiceAccount may use; without these,
the restricted SCC refuses host paths and the device plugin, DRA driver and XPU
Manager never start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SCC_GROUP = "security.openshift.io"
SCC_API_VERSION = f"{SCC_GROUP}/v1"


def service_account(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace},
    }


def scc_objects(
    scc: str,
    account: str,
    namespace: str,
    *,
    volumes: Sequence[str],
    capabilities: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The SCC ``scc``: unprivileged, host paths, every capability dropped but
    ``capabilities``, usable by ``account`` alone.

    The account is named in the SCC's ``users`` (Intel's operator binds a ClusterRole
    granting ``use`` instead): creating such a role needs ``use`` on every SCC,
    privileged ones included, which the operator would then hold itself."""
    return [
        {
            "apiVersion": SCC_API_VERSION,
            "kind": "SecurityContextConstraints",
            "metadata": {"name": scc},
            "allowPrivilegedContainer": False,
            "allowPrivilegeEscalation": False,
            "allowHostDirVolumePlugin": True,
            "allowHostIPC": False,
            "allowHostNetwork": False,
            "allowHostPID": False,
            "allowHostPorts": False,
            "allowedCapabilities": list(capabilities),
            # OpenShift's schema requires these; 0 is what a missing priority means.
            "defaultAddCapabilities": [],
            "priority": 0,
            "requiredDropCapabilities": ["ALL"],
            "readOnlyRootFilesystem": False,
            "fsGroup": {"type": "RunAsAny"},
            "runAsUser": {"type": "RunAsAny"},
            "seLinuxContext": {"type": "RunAsAny"},
            "supplementalGroups": {"type": "RunAsAny"},
            "seccompProfiles": ["*"],
            "volumes": list(volumes),
            "users": [f"system:serviceaccount:{namespace}:{account}"],
            "groups": [],
        }
    ]
