"""API pieces both Tenstorrent kinds share: versions, node choice, status shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from kmodkit.backends.tenstorrent.selection import NodeLabelSelector
from kmodkit.sdk import KubeModel, cel

VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+$"
EXACTLY_ONE_SELECTOR_MSG = "exactly one of spec.nodeAffinity or spec.nodeSelector must be set"
EXACTLY_ONE_SELECTOR_RULE = cel(
    "has(self.nodeAffinity) != has(self.nodeSelector)", EXACTLY_ONE_SELECTOR_MSG
)
PULL_POLICY_PATTERN = r"^(Always|IfNotPresent|Never)$"
MAX_STATUS_NODES = 100
"""Per-node status entries kept; the summary counts every node."""

# A nested object whose fields all have defaults is defaulted as a whole too,
# so `kubectl get -o yaml` shows every effective setting.
DEFAULTED: JsonDict = {"default": {}}
LIST_MAP_BY_NAME: JsonDict = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["name"],
}
LIST_MAP_BY_TYPE: JsonDict = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class NodeChoice(KubeModel):
    """``nodeAffinity`` / ``nodeSelector``: exactly one names the policy's nodes."""

    node_affinity: NodeLabelSelector | None = None
    """Label selector of the nodes this policy manages (ANDed with the Tenstorrent PCI label)."""
    node_selector: NodeLabelSelector | None = None
    """Deprecated alias of nodeAffinity, same shape."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Any:
        if (self.node_affinity is None) == (self.node_selector is None):
            raise ValueError(EXACTLY_ONE_SELECTOR_MSG)
        return self

    def selector(self) -> NodeLabelSelector:
        return self.node_affinity or self.node_selector or NodeLabelSelector()


class NodeEntry(KubeModel):
    """One node's state in a policy's status."""

    name: str = Field(max_length=253)
    state: str = Field(max_length=32)
    reason: str = Field(default="", max_length=64)
    """A CamelCase code a program can match on."""
    current_version: str = Field(default="", max_length=64)
    message: str = Field(default="", max_length=2048)
    last_transition_time: datetime | None = None
