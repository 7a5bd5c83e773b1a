"""What the operator reads from flash pods: whether the kubelet can pull the flasher image.

A flash whose image cannot be pulled shows that as its reason while the Job's
deadline runs (the deadline still decides when the node fails), so an admin
sees a wrong image or a missing pull secret at once instead of a timeout later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.builder_pods import IMAGE_PULL_REASONS

FIELDS = (
    "metadata.labels",
    "spec.nodeName",
    "status.initContainerStatuses[].state",
    "status.containerStatuses[].state",
)
"""What ``image_pull_problems`` reads of a flash pod."""
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
"""The flash pods watched: a finished one waits on no image, and stays a day with its Job (on
every node of a fleet once flashed, 1.8 KB each in the cache)."""


def image_pull_problems(pods: Iterable[Mapping[str, Any]], policy: str) -> dict[str, str]:
    """The kubelet's waiting reason by node, for this policy's flash pods that cannot pull
    their image."""
    mine = names.label_value(policy)
    found: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(keys.TT_FIRMWARE_POLICY_LABEL) != mine:
            continue
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        status = pod.get("status") or {}
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            reason = str(((container.get("state") or {}).get("waiting") or {}).get("reason") or "")
            if node and reason in IMAGE_PULL_REASONS:
                found[node] = reason
    return found
