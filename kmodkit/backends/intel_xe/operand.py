"""What every GPU component's DaemonSet shares: placement, pull secrets, verbosity."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kmodkit.backends.intel_xe.api import ClusterPolicySpec


@dataclass(frozen=True)
class Operands:
    """The inputs every component's manifests are built from."""

    policy: str
    spec: ClusterPolicySpec
    namespace: str
    node_selector: Mapping[str, str]
    settings: Mapping[str, str]
    openshift: bool = False
    """The cluster serves OpenShift's SecurityContextConstraints: each component gets its own."""

    def log_level(self, component: int | None) -> int:
        """The higher of the policy's floor and the component's own level."""
        return max(self.spec.log_level or 0, component or 0)

    def labels(self, app: str) -> dict[str, str]:
        # ``owner`` keeps two policies' DaemonSets from selecting each other's pods.
        return {"app": app, "owner": self.policy}

    def daemon_set(
        self,
        name: str,
        app: str,
        pod: dict[str, Any],
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A DaemonSet of ``pod`` on the policy's GPU nodes, rolled one node at a time."""
        labels = self.labels(app)
        pod_spec = {
            **pod,
            "nodeSelector": dict(self.node_selector),
            "tolerations": [t.to_wire() for t in self.spec.tolerations or []],
        }
        if self.spec.pull_secret is not None:
            pod_spec["imagePullSecrets"] = [{"name": self.spec.pull_secret.name}]
        template_meta: dict[str, Any] = {"labels": labels}
        if annotations:
            template_meta["annotations"] = dict(annotations)
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "updateStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
                },
                "template": {"metadata": template_meta, "spec": pod_spec},
            },
        }


def host_path(name: str, path: str, kind: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": path}
    if kind:
        source["type"] = kind
    return {"name": name, "hostPath": source}


def field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
