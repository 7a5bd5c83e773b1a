"""Which nodes a Tenstorrent policy covers: the node selector model and its matching.

A policy names its nodes with a Kubernetes label selector (``nodeAffinity``, or
the deprecated ``nodeSelector``). A node is covered when the selector matches
it and it carries the NFD label of a Tenstorrent PCI device (unless the
operator is told not to require it). The same selector, with the PCI and skip
labels, becomes the builder DaemonSet's required node affinity
(``owned_affinity``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from kmodkit.backends.tenstorrent import keys
from kmodkit.sdk import KubeModel, LabelSelector, cel, cel_rules

REQUIREMENT_VALUES_MSG = "In and NotIn need at least one value; Exists and DoesNotExist take none"


class SelectorRequirement(KubeModel):
    """One matchExpressions entry: key, operator and (for In and NotIn) values."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                REQUIREMENT_VALUES_MSG,
                subject="values",
                field_path=".values",
            )
        )
    )

    key: str = Field(max_length=317)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[Annotated[str, Field(max_length=63)]] | None = Field(default=None, max_length=64)


class NodeLabelSelector(KubeModel):
    """A label selector over node labels; an empty one selects every node."""

    match_labels: LabelSelector | None = None
    match_expressions: list[SelectorRequirement] | None = Field(default=None, max_length=64)

    def matches(self, node_labels: Mapping[str, str]) -> bool:
        for key, value in (self.match_labels or {}).items():
            if node_labels.get(key) != value:
                return False
        return all(_satisfied(r, node_labels) for r in self.match_expressions or [])

    def keys(self) -> set[str]:
        """The label keys it reads."""
        return set(self.match_labels or {}) | {r.key for r in self.match_expressions or []}


def _satisfied(req: SelectorRequirement, node_labels: Mapping[str, str]) -> bool:
    present = req.key in node_labels
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return not present
    inside = present and node_labels[req.key] in (req.values or [])
    return inside if req.operator == "In" else not inside


def covers(selector: NodeLabelSelector, node_labels: Mapping[str, str], require_pci: bool) -> bool:
    """Whether a policy with ``selector`` covers a node (the skip label aside)."""
    if require_pci and node_labels.get(keys.TT_PCI_PRESENT_LABEL) != "true":
        return False
    return selector.matches(node_labels)
