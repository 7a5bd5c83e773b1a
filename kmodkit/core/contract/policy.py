"""The rollout policy a backend embeds in its custom resource (``spec.upgradePolicy``).

Durations are whole seconds so tests can make them short. Defaults are the
conservative ones: one node at a time, halt on the first failure, no full drain.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import Field, field_validator

from kmodkit.core.api.base import KubeModel
from kmodkit.core.selectors import is_label_key, is_label_value, selector_error

_PERCENT = re.compile(r"^([1-9][0-9]?|100)%$")
LabelSelectorText = Annotated[str, Field(max_length=1024)]


def _valid_selector(value: str) -> str:
    problem = selector_error(value)
    if problem is not None:
        raise ValueError(problem)
    return value


class WaitForCompletion(KubeModel):
    """Let selected pods (batch jobs, say) finish by themselves before evicting anything."""

    pod_selector: LabelSelectorText
    """Label selector of the pods to wait for; only Running and Pending ones are waited for."""
    timeout_seconds: int = Field(default=0, ge=0)
    """Stop waiting and go on evicting after this long; 0 waits as long as it takes."""

    _check_selector = field_validator("pod_selector")(_valid_selector)


class DeviceEviction(KubeModel):
    """Drain pass 1: the pods the backend says hold the device."""

    enable: bool = True
    """Run pass 1 at all; False goes from cordoning (or gating) straight on."""

    force: bool = False
    """Also evict device consumers no controller will recreate (bare pods)."""
    timeout_seconds: int = Field(default=300, ge=1)
    """Fail the node if device consumers are still there after this long."""


class Drain(KubeModel):
    """Drain pass 2: ``kubectl drain`` semantics over the pods the selector picks."""

    enable: bool = False
    """Run pass 2 at all (Tenstorrent's ``fullNode``)."""
    pod_selector: LabelSelectorText = ""
    """Only pods matching this label selector are evicted; empty means every pod."""
    force: bool = False
    """Also evict bare pods (no controller); they are skipped otherwise."""
    delete_empty_dir: bool = False
    """Also evict pods with emptyDir volumes (their data is lost); skipped otherwise."""
    timeout_seconds: int = Field(default=300, ge=1)
    """Fail the node if selected pods are still there after this long."""
    spared_namespaces: list[str] = Field(default_factory=list, max_length=16)
    """Namespaces whose pods are never evicted (the operator's own: the operator itself and
    the Jobs it runs on the node, which a drain must not cut short)."""

    _check_selector = field_validator("pod_selector")(_valid_selector)


class UpgradePolicy(KubeModel):
    """How a disruptive change is rolled across the nodes of one policy."""

    max_parallel: int = Field(default=1, ge=1)
    """Nodes in progress (cordoned through uncordoning) at once."""
    max_unavailable: int | str = "25%"
    """Targeted nodes that may be unavailable at once, counting nodes already cordoned or
    NotReady for any reason except those the rollout is through with (done, or failed for
    this target): a count, or a percentage of the targeted nodes rounded up."""
    halt_on_failure: bool = True
    """Start no new node while any targeted node is failed."""
    upgrade_cordoned_nodes: bool = False
    """Also change nodes someone else cordoned (an admin's maintenance, another tool): they are
    drained and changed under that cordon, which stays afterwards. False leaves such a node alone
    (reported ``ExternalCordon``) until it is uncordoned."""
    cordon: bool = True
    """Cordon each node while it is changed. False changes it with workloads still scheduled
    there (Tenstorrent firmware with ``drain.enable: false``); a cordon made by someone else
    is still honoured as above."""
    deploy_gates: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Node labels set while the node is drained (e.g. ``tenstorrent.com/deploy.tt-telemetry:
    "false"``) so sibling DaemonSets holding the device leave; restored afterwards."""
    wait_for_completion: WaitForCompletion | None = None
    """Optional: wait for selected pods to finish before evicting."""
    device_eviction: DeviceEviction = Field(default_factory=DeviceEviction)
    drain: Drain = Field(default_factory=Drain)
    validation_timeout_seconds: int = Field(default=600, ge=1)
    """Fail the node if the backend has not reported it healthy this long after the swap."""

    @field_validator("max_unavailable")
    @classmethod
    def _check_max_unavailable(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be at least 1 node")
        if isinstance(value, str) and not _PERCENT.match(value):
            raise ValueError("must be a whole number of nodes or a percentage from 1% to 100%")
        return value

    @field_validator("deploy_gates")
    @classmethod
    def _check_gates(cls, value: dict[str, str]) -> dict[str, str]:
        for key, gate in value.items():
            if not is_label_key(key):
                raise ValueError(f"{key!r} is not a valid node label key")
            if not is_label_value(gate):
                raise ValueError(f"{gate!r} (for {key}) is not a valid label value")
        return value

    def max_unavailable_nodes(self, targeted: int) -> int:
        """The unavailability budget in nodes; a percentage rounds up, and is never below 1."""
        if isinstance(self.max_unavailable, int):
            return self.max_unavailable
        percent = int(self.max_unavailable.rstrip("%"))
        return max(1, math.ceil(targeted * percent / 100))
