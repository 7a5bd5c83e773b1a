"""TenstorrentDriverPolicy (``ttdp``): tt-kmd and tt-smi on a set of nodes.

Field names and defaults follow upstream tt-k8s-driver-manager, so its
manifests apply unchanged. Additions: ``upgradePolicy.haltOnFailure``,
``upgradePolicy.upgradeCordonedNodes`` and ``upgradePolicy.upgradeTimeoutSeconds``, and a
status that also counts host-managed and skipped nodes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from kmodkit.backends.tenstorrent.api_common import (
    DEFAULTED,
    EXACTLY_ONE_SELECTOR_RULE,
    LIST_MAP_BY_NAME,
    LIST_MAP_BY_TYPE,
    PULL_POLICY_PATTERN,
    VERSION_PATTERN,
    NodeChoice,
    NodeEntry,
)
from kmodkit.sdk import (
    Condition,
    CrdSource,
    ImageRef,
    KubeModel,
    ObjectMeta,
    PrinterColumn,
    cel_rules,
    selector_error,
)

GROUP = "driver.tenstorrent.com"
VERSION = "v1alpha1"
KIND = "TenstorrentDriverPolicy"
PLURAL = "tenstorrentdriverpolicies"
API_VERSION = f"{GROUP}/{VERSION}"

DriverNodeState = Literal[
    "Pending",
    "Cordoning",
    "Draining",
    "Upgrading",
    "Uncordoning",
    "Done",
    "Failed",
    "HostManaged",
    "Skipped",
    "Conflict",
]


class DriverDrain(KubeModel):
    """How a node is emptied before its tt-kmd is swapped."""

    enable: bool = True
    """Cordon, gate sibling DaemonSets and evict /dev/tenstorrent holders before the swap."""
    full_node: bool = True
    """Drain pass 2: also evict every other pod (kubectl drain semantics)."""
    pod_selector_label: str = Field(default="", max_length=1024)
    """Label selector limiting drain pass 2 (``k=v``, ``k``, ``k notin (a,b)``); empty: all."""
    force: bool = False
    """Also evict pods no controller owns (they are not recreated)."""
    delete_empty_dir: bool = True
    """Pass 2 also evicts pods with emptyDir volumes (their data is lost)."""
    timeout_seconds: int = Field(default=600, ge=10)
    """Fail the node when pods are still there this long after each drain pass started."""

    @field_validator("pod_selector_label")
    @classmethod
    def _selector(cls, value: str) -> str:
        problem = selector_error(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class DriverUpgradePolicy(KubeModel):
    """How a new tt-kmd reaches the nodes: strictly one node at a time."""

    drain: DriverDrain = Field(default_factory=DriverDrain, json_schema_extra=DEFAULTED)
    force_unload: bool = False
    """SIGKILL processes still holding /dev/tenstorrent before unloading (loses their work)."""
    halt_on_failure: bool = True
    """Start no further node while a node of this policy has failed."""
    upgrade_cordoned_nodes: bool = False
    """Also upgrade nodes someone else cordoned (an admin's maintenance, another tool): drained
    and upgraded under that cordon, which stays. False leaves them alone, reported
    ExternalCordon, until they are uncordoned."""
    upgrade_timeout_seconds: int = Field(default=1800, ge=60)
    """Fail the node if its new builder is not Ready at the new version this long after the swap
    (a first build on a node clones tt-kmd and compiles it; later ones hit the cache)."""


class Installer(KubeModel):
    """The builder image (tt-kmd build toolchain and tt-smi)."""

    image: ImageRef | None = None
    """Overrides the operator's KMODKIT_TT_BUILDER_IMAGE for this policy."""
    image_pull_policy: str = Field(default="IfNotPresent", pattern=PULL_POLICY_PATTERN)


class TenstorrentDriverPolicySpec(NodeChoice):
    """The tt-kmd version a set of nodes runs, and how it is rolled out."""

    model_config = ConfigDict(json_schema_extra=cel_rules(EXACTLY_ONE_SELECTOR_RULE))

    version: str = Field(pattern=VERSION_PATTERN, max_length=32)
    """tt-kmd release, e.g. 2.8.0 (built from git tag ttkmd-<version>)."""
    paused: bool = False
    """Stop starting nodes; nodes already being upgraded finish."""
    upgrade_policy: DriverUpgradePolicy = Field(
        default_factory=DriverUpgradePolicy, json_schema_extra=DEFAULTED
    )
    installer: Installer = Field(default_factory=Installer, json_schema_extra=DEFAULTED)


class DriverSummary(KubeModel):
    matched: int = 0
    """Nodes the policy covers (skipped ones included)."""
    ready: int = 0
    """Nodes whose builder is Ready at the policy's version."""
    up_to_date: int = 0
    """Done, or host-managed (DKMS owns tt-kmd there)."""
    in_progress: int = 0
    failed: int = 0
    pending: int = 0
    host_managed: int = 0
    skipped: int = 0
    conflicts: int = 0
    """Covered nodes an older driver policy owns (state Conflict): this one leaves them alone."""


class DriverNodeEntry(NodeEntry):
    state: DriverNodeState


class TenstorrentDriverPolicyStatus(KubeModel):
    observed_generation: int | None = None
    desired_version: str = ""
    daemon_set: str = ""
    summary: DriverSummary = Field(default_factory=DriverSummary)
    nodes: list[DriverNodeEntry] = Field(
        default_factory=list, max_length=100, json_schema_extra=LIST_MAP_BY_NAME
    )
    """Nodes that are not plainly done (failed first), then done ones, at most 100."""
    nodes_omitted: int = 0
    conditions: list[Condition] = Field(
        default_factory=list, max_length=8, json_schema_extra=LIST_MAP_BY_TYPE
    )


class TenstorrentDriverPolicy(KubeModel):
    """tt-kmd (built on each node from source) and tt-smi on the Tenstorrent nodes it selects."""

    api_version: Literal["driver.tenstorrent.com/v1alpha1"] = "driver.tenstorrent.com/v1alpha1"
    kind: Literal["TenstorrentDriverPolicy"] = "TenstorrentDriverPolicy"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TenstorrentDriverPolicySpec
    status: TenstorrentDriverPolicyStatus | None = None


COLUMNS = (
    PrinterColumn("Version", "string", ".spec.version"),
    PrinterColumn("Matched", "integer", ".status.summary.matched"),
    PrinterColumn("Ready", "integer", ".status.summary.ready"),
    PrinterColumn("UpToDate", "integer", ".status.summary.upToDate"),
    PrinterColumn("InProgress", "integer", ".status.summary.inProgress"),
    PrinterColumn("Failed", "integer", ".status.summary.failed"),
    PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
)

DRIVER_CRD = CrdSource(
    group=GROUP,
    version=VERSION,
    kind=KIND,
    plural=PLURAL,
    short_names=("ttdp",),
    namespaced=False,
    spec_model=TenstorrentDriverPolicySpec,
    status_model=TenstorrentDriverPolicyStatus,
    description=TenstorrentDriverPolicy.__doc__ or "",
    printer_columns=COLUMNS,
)
