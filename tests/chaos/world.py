"""The fleet and workloads of the chaos run, and what "finished" means for them.

Three fleets of kwok nodes, tagged so nothing else is touched:

- 200 nodes with two Modules: one whose image changes (maxUnavailable 10%) and
  one that never changes (on the first 50 nodes);
- 30 nodes of a Tenstorrent driver policy (strictly one node at a time), with
  device-holding Deployments, a telemetry DaemonSet behind its deploy gate, and
  one node an admin cordoned;
- 30 nodes of a Tenstorrent firmware policy (maxParallel 3) with device holders.

A PodDisruptionBudget-protected Deployment spreads over both Tenstorrent fleets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from kmodkit.backends.tenstorrent import keys as tt_keys
from kmodkit.backends.tenstorrent import names as tt_names
from kmodkit.core import labels
from kmodkit.core.engine.loader_pod import MODULE_LABEL
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.states import IN_FLIGHT, parse_state
from kmodkit_dev import tenstorrent_demo as demo
from kmodkit_dev.nodes import TENSTORRENT_LABELS, node_manifest

KERNEL = "6.8.0-45-generic"
GATE = "tenstorrent.com/deploy.tt-telemetry"
MODULES = ("kmodkit.io", "v1alpha1", "modules")
DRIVER = ("driver.tenstorrent.com", "v1alpha1", "tenstorrentdriverpolicies")
FIRMWARE = ("firmware.tenstorrent.com", "v1alpha1", "tenstorrentfirmwarepolicies")
WEB = "web"
LOAD_TIME = "4s"
"""How long a loader pod of the changing Module takes to turn Ready."""


@dataclass(frozen=True)
class World:
    tag: str
    operator_ns: str
    work_ns: str
    registry_host: str
    module_nodes: tuple[str, ...]
    driver_nodes: tuple[str, ...]
    firmware_nodes: tuple[str, ...]

    @classmethod
    def named(cls, tag: str, registry_host: str, module_nodes: int = 200) -> World:
        return cls(
            tag,
            f"chaos-op-{tag}",
            f"chaos-work-{tag}",
            registry_host,
            tuple(f"cm-{tag}-{i:03}" for i in range(module_nodes)),
            tuple(f"cd-{tag}-{i:02}" for i in range(30)),
            tuple(f"cf-{tag}-{i:02}" for i in range(30)),
        )

    # -- names ---------------------------------------------------------------------

    changing = "kmod"
    stable = "stable"
    driver = "drv"
    firmware = "fw"

    @property
    def stable_nodes(self) -> tuple[str, ...]:
        return self.module_nodes[:50]

    @property
    def external_cordon(self) -> str:
        return self.driver_nodes[4]

    @property
    def goes_down(self) -> str:
        return self.driver_nodes[9]

    @property
    def driver_keys(self) -> RolloutKeys:
        return RolloutKeys.for_policy(tt_names.driver_policy_id(self.driver))

    @property
    def firmware_keys(self) -> RolloutKeys:
        return RolloutKeys.for_policy(tt_names.firmware_policy_id(self.firmware))

    def ready_label(self, module: str) -> str:
        return labels.READY.key(self.work_ns, module)

    def image(self, module: str, version: str) -> str:
        return f"{self.registry_host}/kmods/{module}:{version}"

    # -- manifests -------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        def tagged(names: Iterable[str], group: str, **extra: str) -> list[dict[str, Any]]:
            return [
                node_manifest(n, KERNEL, {"chaos": self.tag, "chaos-group": group, **extra})
                for n in names
            ]

        stable = set(self.stable_nodes)
        return [
            *(
                node_manifest(
                    n,
                    KERNEL,
                    {"chaos": self.tag, "chaos-group": "module"}
                    | ({"chaos-stable": "yes"} if n in stable else {}),
                )
                for n in self.module_nodes
            ),
            *tagged(self.driver_nodes, "driver", **TENSTORRENT_LABELS, **{GATE: "true"}),
            *tagged(self.firmware_nodes, "firmware", **TENSTORRENT_LABELS, **{GATE: "true"}),
        ]

    def module(self, name: str, version: str, selector: dict[str, str]) -> dict[str, Any]:
        """A Module of the fleet. The changing one's loader pods turn Ready only after a
        few seconds (kwok's stages read the toleration), as a real load takes: otherwise
        kwok settles every node at once and its budget is never tested."""
        slow = (
            [
                {
                    "key": "kmodkit.io/simulate-ready-after",
                    "operator": "Equal",
                    "value": LOAD_TIME,
                    "effect": "NoSchedule",
                }
            ]
            if name == self.changing
            else []
        )
        return {
            "apiVersion": "kmodkit.io/v1alpha1",
            "kind": "Module",
            "metadata": {"name": name},
            "spec": {
                "selector": {"chaos": self.tag, **selector},
                "imageRepoSecret": {"name": "pull"},
                "rollout": {"maxUnavailable": "10%"},
                **({"tolerations": slow} if slow else {}),
                "moduleLoader": {
                    "container": {
                        "modprobe": {"moduleName": f"chaos_{name}"},
                        "kernelMappings": [
                            {"literal": KERNEL, "containerImage": self.image(name, version)}
                        ],
                    }
                },
            },
        }

    def driver_policy(self, version: str) -> dict[str, Any]:
        return demo.driver_policy(
            self.driver,
            version,
            {"chaos": self.tag, "chaos-group": "driver"},
            upgradePolicy={
                "drain": {"timeoutSeconds": 120, "podSelectorLabel": f"app in ({WEB},holder)"},
                "upgradeTimeoutSeconds": 900,
            },
        )

    def firmware_policy(self, version: str) -> dict[str, Any]:
        return demo.firmware_policy(
            self.firmware,
            version,
            {"chaos": self.tag, "chaos-group": "firmware"},
            upgradePolicy={"maxParallel": 3, "drain": {"timeoutSeconds": 120}},
        )

    def holders(self) -> list[dict[str, Any]]:
        """A device-holding Deployment on every third Tenstorrent node."""
        return [demo.device_holder(n) for n in (*self.driver_nodes, *self.firmware_nodes)[::3]]

    def web(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A Deployment over both Tenstorrent fleets and its PodDisruptionBudget."""
        pod_labels = {"app": WEB}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": WEB},
            "spec": {
                "replicas": 12,
                "selector": {"matchLabels": pod_labels},
                "template": {
                    "metadata": {"labels": pod_labels},
                    "spec": {
                        "nodeSelector": {"chaos": self.tag},
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {
                                                    "key": "chaos-group",
                                                    "operator": "In",
                                                    "values": ["driver", "firmware"],
                                                }
                                            ]
                                        }
                                    ]
                                }
                            }
                        },
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "web", "image": "registry.invalid/web:1"}],
                    },
                },
            },
        }
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": WEB},
            "spec": {"maxUnavailable": 2, "selector": {"matchLabels": pod_labels}},
        }
        return deployment, pdb


def patch_spec(
    api: Any, kind: tuple[str, str, str], name: str, spec: dict[str, Any], ns: str = ""
) -> None:
    objects = client.CustomObjectsApi(api)
    group, version, plural = kind
    body = {"spec": spec}
    if ns:
        objects.patch_namespaced_custom_object(group, version, ns, plural, name, body)
    else:
        objects.patch_cluster_custom_object(group, version, plural, name, body)


def module_settled(
    core: client.CoreV1Api, world: World, module: str, image: str, nodes: Iterable[str]
) -> bool:
    """Every node runs one Ready loader of ``module`` for ``image`` and carries its ready label."""
    pods = core.list_namespaced_pod(
        world.work_ns, label_selector=f"{MODULE_LABEL}={module}", _preload_content=False
    )
    ready: dict[str, int] = {}
    for pod in json.loads(pods.data)["items"]:
        meta, spec = pod["metadata"], pod["spec"]
        images = {c.get("image") for c in spec.get("initContainers", []) + spec["containers"]}
        conditions = (pod.get("status") or {}).get("conditions") or []
        if (
            not meta.get("deletionTimestamp")
            and image in images
            and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        ):
            ready[spec.get("nodeName", "")] = ready.get(spec.get("nodeName", ""), 0) + 1
    if any(ready.get(n) != 1 for n in nodes):
        return False
    label = world.ready_label(module)
    return all(label in (core.read_node(n).metadata.labels or {}) for n in nodes)


def rollout_done(
    core: client.CoreV1Api, keys: RolloutKeys, nodes: Iterable[str], held: Iterable[str] = ()
) -> bool:
    """Every node done and schedulable; a node the rollout must leave alone (an admin's
    cordon) at rest: not in flight, so that one wrongly taken is seen to the end."""
    at_rest = set(held)
    for n in nodes:
        node = core.read_node(n)
        state = (node.metadata.labels or {}).get(keys.state)
        if n in at_rest:
            if parse_state(state) in IN_FLIGHT:
                return False
        elif state != "done" or node.spec.unschedulable:
            return False
    return True


def kmd_versions(core: client.CoreV1Api, nodes: Iterable[str]) -> dict[str, str | None]:
    return {
        n: (core.read_node(n).metadata.labels or {}).get(tt_keys.TT_KMD_VERSION_LABEL)
        for n in nodes
    }
