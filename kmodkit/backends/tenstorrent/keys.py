"""Every label and annotation key of the Tenstorrent backend, on Nodes, builder pods and Jobs.

The driver.tenstorrent.com / firmware.tenstorrent.com names are the ones
upstream tt-k8s-driver-manager uses, so admins' selectors and habits carry over.
"""

from __future__ import annotations

TT_PCI_PRESENT_LABEL = "feature.node.kubernetes.io/pci-1200_1e52.present"
"""Node label (NFD): a Tenstorrent PCI device (vendor 1e52, class 1200) is present."""
TT_DRIVER_PREFIX = "driver.tenstorrent.com"
TT_FIRMWARE_PREFIX = "firmware.tenstorrent.com"
TT_DRIVER_SKIP_LABEL = f"{TT_DRIVER_PREFIX}/skip"
"""Node label set by an admin: ``true`` takes the node out of every driver policy."""
TT_FIRMWARE_SKIP_LABEL = f"{TT_FIRMWARE_PREFIX}/skip"
"""Node label set by an admin: ``true`` takes the node out of every firmware policy."""
TT_INSTALL_MODE_LABEL = f"{TT_DRIVER_PREFIX}/install-mode"
"""Node label written by the builder: ``host`` (DKMS owns tt-kmd) or ``container``."""
TT_STANDBY_POD_LABEL = f"{TT_DRIVER_PREFIX}/standby-pod"
"""Node label written by a builder that stood by for DKMS and found it gone: its pod name.
The rollout takes the node over (cordon, drain) and replaces exactly that pod."""
TT_KMD_VERSION_LABEL = f"{TT_DRIVER_PREFIX}/kmd-version"
"""Node label written by the builder: the tt-kmd version loaded now."""
TT_SMI_VERSION_LABEL = "tt-smi.driver.tenstorrent.com/version"
"""Node label written by the builder: the tt-smi version it installed on the host."""
TT_DRIVER_POLICY_LABEL = f"{TT_DRIVER_PREFIX}/cr"
"""Builder DaemonSet and pod label: the TenstorrentDriverPolicy they belong to."""
TT_TEMPLATE_HASH_ANNOTATION = f"{TT_DRIVER_PREFIX}/template-hash"
"""Builder DaemonSet and pod annotation: hash of the pod template the pod was made from."""
TT_FIRMWARE_POLICY_LABEL = f"{TT_FIRMWARE_PREFIX}/cr"
"""Flash Job and pod label: the TenstorrentFirmwarePolicy."""
TT_FIRMWARE_NODE_LABEL = f"{TT_FIRMWARE_PREFIX}/node"
"""Flash Job and pod label: the node flashed."""
TT_FIRMWARE_VERSION_LABEL = f"{TT_FIRMWARE_PREFIX}/version"
"""Flash Job and pod label: the bundle version, dots replaced by dashes."""
TT_FLASH_ATTEMPT_ANNOTATION = f"{TT_FIRMWARE_PREFIX}/attempt"
"""Flash Job annotation: the rollout attempt on the node that created the Job."""
TT_FLASH_POLICY_UID_ANNOTATION = f"{TT_FIRMWARE_PREFIX}/cr-uid"
"""Flash Job annotation: the uid of the policy that made it. The Job has no ownerReference
(the garbage collector must never cut a flash short), so this tells one policy's Jobs from
those of an earlier, deleted policy of the same name."""
TT_FW_CURRENT_VERSION_ANNOTATION = f"{TT_FIRMWARE_PREFIX}/current-version"
"""Node annotation: the firmware bundle version read back after the last successful flash.
Durable: a node carrying the desired version is never flashed again (unless forced)."""
TT_FW_VERSION_LABEL = f"{TT_FIRMWARE_PREFIX}/fw-version"
"""Node label: the same version as a label, for selectors and ``kubectl get -L``."""
TT_FW_LAST_JOB_ANNOTATION = f"{TT_FIRMWARE_PREFIX}/last-flash-job"
"""Node annotation: the flash Job that wrote ``current-version``."""
TT_FW_FORCED_ANNOTATION = f"{TT_FIRMWARE_PREFIX}/force-written"
"""Node annotation ``<policy>/<request>``: the forceWrite request already carried out here."""


def tenstorrent_label(key: str) -> bool:
    """Whether a node label is the backend's own (any of Tenstorrent's domains) or the PCI
    label it selects by."""
    domain = key.partition("/")[0] if "/" in key else ""
    return (
        key == TT_PCI_PRESENT_LABEL
        or domain == "tenstorrent.com"
        or domain.endswith(".tenstorrent.com")
    )
