"""Status of a kmodkit Module: KMM's counters, plus conditions and per-node failures.

KMM reports counters only, so a failed load on one node is invisible unless
users go hunting through worker pods. kmodkit adds standard conditions and a
bounded list of per-node failures; the bound keeps status writes small on a
fleet of thousands of nodes where many may fail the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from kmodkit.core.api.base import KubeModel, ObjectName, ShortName, Text

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"

MAX_NODE_FAILURES = 50


class Condition(KubeModel):
    """A condition in the shape the Kubernetes API conventions prescribe."""

    type: ShortName
    """Ready, Progressing or Degraded."""
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """A CamelCase word a program can match on."""
    message: str = Field(default="", max_length=32768)
    """What happened, for people."""
    last_transition_time: datetime
    """When status last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this condition was computed from."""


class ModuleLoaderStatus(KubeModel):
    """Node counts, as in KMM's status.moduleLoader, plus readyNumber."""

    nodes_matching_selector_number: int = Field(default=0, ge=0)
    """Schedulable nodes that match the selector."""
    desired_number: int = Field(default=0, ge=0)
    """Nodes that should have the module loaded."""
    available_number: int = Field(default=0, ge=0)
    """Nodes where the module is loaded as specified."""
    ready_number: int = Field(default=0, ge=0)
    """Nodes where the module is loaded at the wanted version and the node is back in service."""


class DevicePluginStatus(KubeModel):
    """KMM's status.devicePlugin, from the device plugin's DaemonSet."""

    nodes_matching_selector_number: int = Field(default=0, ge=0)
    """Selected nodes (the module ready on them or not)."""
    desired_number: int = Field(default=0, ge=0)
    """Nodes the DaemonSet should run on: selected, and the module ready there."""
    available_number: int = Field(default=0, ge=0)
    """Nodes where a device-plugin pod is available."""


class NodeFailure(KubeModel):
    """Why the module is not working on one node."""

    node: ObjectName
    mapping_index: int | None = Field(default=None, ge=0)
    """Index of the kernel mapping that applied, if one did."""
    reason: ShortName
    """A CamelCase word a program can match on."""
    message: Text
    """What is wrong and what to do about it."""


class UnmappedNode(KubeModel):
    """A selected node no kernel mapping serves: not a failure, nothing is loaded there."""

    node: ObjectName
    kernel: Text


class ModuleStatus(KubeModel):
    """Observed state of a Module."""

    conditions: list[Condition] | None = Field(
        default=None,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    module_loader: ModuleLoaderStatus | None = None
    device_plugin: DevicePluginStatus | None = None
    node_failures: list[NodeFailure] | None = Field(default=None, max_length=MAX_NODE_FAILURES)
    """Nodes where loading failed, at most 50; the Degraded condition counts them all."""
    unmapped_nodes: list[UnmappedNode] | None = Field(default=None, max_length=MAX_NODE_FAILURES)
    """Selected nodes whose kernel no mapping matches, at most 50 (the Ready condition counts
    them all): they are not desired, as in KMM, and do not make the Module Degraded."""
    image_rebuild_trigger_generation: int | None = Field(default=None, ge=0)
    """The spec.imageRebuildTriggerGeneration the engine last acted on (as KMM's status field):
    images re-checked with their registry and failed builds retried without back-off."""
