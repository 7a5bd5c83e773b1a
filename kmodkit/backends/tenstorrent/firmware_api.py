"""TenstorrentFirmwarePolicy (``ttfwp``): the firmware bundle a set of nodes runs.

Field names and defaults follow upstream tt-k8s-driver-manager, so its
manifests apply unchanged. The status remembers the ``forceWrite`` request it
carried out, and nodes remember the version flashed, so nothing is flashed twice.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

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
    LabelSelector,
    ObjectMeta,
    PrinterColumn,
    cel_rules,
)

GROUP = "firmware.tenstorrent.com"
VERSION = "v1alpha1"
KIND = "TenstorrentFirmwarePolicy"
PLURAL = "tenstorrentfirmwarepolicies"
API_VERSION = f"{GROUP}/{VERSION}"

READBACK_PATTERN = r"^[0-9]+(\.[0-9]+){2,3}$"
BUNDLE_URL_PATTERN = r"^https?://[^\s]+$"

FirmwareNodeState = Literal[
    "Pending",
    "Cordoning",
    "Draining",
    "Flashing",
    "Uncordoning",
    "Done",
    "Failed",
    "Skipped",
    "Conflict",
]


class FirmwareDrain(KubeModel):
    """How a node is emptied before it is flashed."""

    enable: bool = True
    """Cordon the node and evict /dev/tenstorrent holders before flashing."""
    force: bool = False
    """Also evict device holders no controller owns (they are not recreated)."""
    delete_empty_dir: bool = True
    """Accepted for upstream manifests. Device holders are always evicted, emptyDir or not:
    flashing under a pod that holds the device would break both."""
    timeout_seconds: int = Field(default=600, ge=10)
    """Fail the node when device holders are still there this long after eviction started."""


class FirmwareUpgradePolicy(KubeModel):
    """How the bundle reaches the nodes."""

    auto_upgrade: bool = True
    """Flash nodes that differ from spec.version; false only reports the drift."""
    max_parallel: int = Field(default=1, ge=1)
    """Nodes being drained or flashed at once."""
    flash_timeout_seconds: int = Field(default=900, ge=60)
    """Deadline of each flash Job (its activeDeadlineSeconds)."""
    drain: FirmwareDrain = Field(default_factory=FirmwareDrain, json_schema_extra=DEFAULTED)
    halt_on_failure: bool = True
    """Start no further node while a node of this policy has failed."""
    upgrade_cordoned_nodes: bool = False
    """Also flash nodes someone else cordoned (an admin's maintenance, another tool): drained
    and flashed under that cordon, which stays. False leaves them alone, reported
    ExternalCordon, until they are uncordoned."""


class Flasher(KubeModel):
    """The flash Job's image and tt-flash options."""

    image: ImageRef | None = None
    """Overrides the operator's KMODKIT_TT_FLASHER_IMAGE for this policy."""
    image_pull_policy: str = Field(default="IfNotPresent", pattern=PULL_POLICY_PATTERN)
    force_write: bool = False
    """Flash every node once more, even one already at spec.version (tt-flash --force). Each
    time this is switched on counts as one request; a node is flashed once per request."""
    continue_on_readback_failure: bool = False
    """Flash even when tt-smi cannot read the current version after one reset."""
    homogenize_firmware_versions: bool = False
    """Pass --force to tt-flash when the chips of a node report different versions."""
    pod_labels: LabelSelector | None = None
    """Extra labels on the flash pods (for network policies or cost allocation)."""


class TenstorrentFirmwarePolicySpec(NodeChoice):
    """The firmware bundle a set of nodes runs, and how it is flashed."""

    model_config = ConfigDict(json_schema_extra=cel_rules(EXACTLY_ONE_SELECTOR_RULE))

    version: str = Field(pattern=VERSION_PATTERN, max_length=32)
    """Firmware bundle release, e.g. 19.9.0 (fw_pack-<version>.fwbundle)."""
    readback_version: str | None = Field(default=None, pattern=READBACK_PATTERN, max_length=40)
    """What tt-smi reports after the flash; default <version>.0."""
    bundle_url: str | None = Field(
        default=None, alias="bundleURL", pattern=BUNDLE_URL_PATTERN, max_length=2048
    )
    """Where the bundle is downloaded from; default the tt-system-firmware GitHub release."""
    paused: bool = False
    """Start no further node; flashes already running finish."""
    upgrade_policy: FirmwareUpgradePolicy = Field(
        default_factory=FirmwareUpgradePolicy, json_schema_extra=DEFAULTED
    )
    flasher: Flasher = Field(default_factory=Flasher, json_schema_extra=DEFAULTED)

    def readback(self) -> str:
        return self.readback_version or f"{self.version}.0"

    def bundle(self) -> str:
        return self.bundle_url or (
            "https://github.com/tenstorrent/tt-system-firmware/releases/download/"
            f"v{self.version}/fw_pack-{self.version}.fwbundle"
        )


class FirmwareSummary(KubeModel):
    matched: int = 0
    up_to_date: int = 0
    in_progress: int = 0
    failed: int = 0
    pending: int = 0
    skipped: int = 0
    conflicts: int = 0
    """Covered nodes an older firmware policy owns (state Conflict): this one leaves them alone."""


class FirmwareNodeEntry(NodeEntry):
    state: FirmwareNodeState
    last_flash_job: str = Field(default="", max_length=63)


class TenstorrentFirmwarePolicyStatus(KubeModel):
    observed_generation: int | None = None
    desired_version: str = ""
    force_write_request: int = 0
    """The generation at which spec.flasher.forceWrite was switched on (0 while it is off);
    nodes record the request they were force-flashed for, so each flashes a node once."""
    summary: FirmwareSummary = Field(default_factory=FirmwareSummary)
    nodes: list[FirmwareNodeEntry] = Field(
        default_factory=list, max_length=100, json_schema_extra=LIST_MAP_BY_NAME
    )
    """Nodes that are not plainly done (failed first), then done ones, at most 100."""
    nodes_omitted: int = 0
    conditions: list[Condition] = Field(
        default_factory=list, max_length=8, json_schema_extra=LIST_MAP_BY_TYPE
    )


class TenstorrentFirmwarePolicy(KubeModel):
    """Tenstorrent device firmware, flashed node by node on the nodes it selects."""

    api_version: Literal["firmware.tenstorrent.com/v1alpha1"] = "firmware.tenstorrent.com/v1alpha1"
    kind: Literal["TenstorrentFirmwarePolicy"] = "TenstorrentFirmwarePolicy"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TenstorrentFirmwarePolicySpec
    status: TenstorrentFirmwarePolicyStatus | None = None


FIRMWARE_CRD = CrdSource(
    group=GROUP,
    version=VERSION,
    kind=KIND,
    plural=PLURAL,
    short_names=("ttfwp",),
    namespaced=False,
    spec_model=TenstorrentFirmwarePolicySpec,
    status_model=TenstorrentFirmwarePolicyStatus,
    description=TenstorrentFirmwarePolicy.__doc__ or "",
    printer_columns=(
        PrinterColumn("Version", "string", ".spec.version"),
        PrinterColumn("Matched", "integer", ".status.summary.matched"),
        PrinterColumn("UpToDate", "integer", ".status.summary.upToDate"),
        PrinterColumn("InProgress", "integer", ".status.summary.inProgress"),
        PrinterColumn("Failed", "integer", ".status.summary.failed"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
    ),
)
