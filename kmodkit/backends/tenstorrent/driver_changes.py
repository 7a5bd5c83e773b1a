"""What a driver policy change means for a node: a reload of tt-kmd, a builder restart, or nothing.

Only the tt-kmd version decides which module a builder loads: the build inputs are the git tag
``ttkmd-<version>`` and the node's kernel, and the build cache is keyed by both. A new builder
image (tt-smi, toolchain), new proxy variables or a new pull policy find that module already
loaded, and the new builder adopts it. So:

- a node whose loaded tt-kmd is another version needs a **reload**: it goes through the rollout
  (cordon, drain, swap), one node at a time;
- a node whose builder runs an older template but whose tt-kmd is right needs only a **restart**
  of its builder: no cordon, no drain, no unload, a few builders at a time
  (``builders_to_restart``);
- a node whose builder stood by for DKMS and saw it vacated is **taken over** through the rollout
  too (the migration guide's cordon and drain), its standby builder replaced by the swap;
- ``forceUnload`` is neither: it says how a builder unloads. Only a builder that is trying to
  unload (crash-looping on a refused unload) has a use for a new setting, and only such a pod is
  replaced for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kmodkit.backends.tenstorrent import keys
from kmodkit.backends.tenstorrent.builder_pods import BuilderPod
from kmodkit.sdk import NodeView, State, parse_state


@dataclass(frozen=True)
class DriverTarget:
    version: str
    template_hash: str
    force_unload: bool
    drain: bool


def host_managed(node_labels: Mapping[str, str]) -> bool:
    return node_labels.get(keys.TT_INSTALL_MODE_LABEL) == "host"


def needs_reload(node_labels: Mapping[str, str], target: DriverTarget) -> bool:
    """A container-managed node with another tt-kmd loaded than the target's.

    Host-managed nodes (DKMS) are never touched. A node with nothing loaded has nothing to
    unload: its builder loads the target directly.
    """
    loaded = node_labels.get(keys.TT_KMD_VERSION_LABEL, "")
    return not host_managed(node_labels) and bool(loaded) and loaded != target.version


def is_standing_by(node_labels: Mapping[str, str], pod: BuilderPod | None) -> bool:
    """The node's builder stood by for DKMS, found it gone, and waits to be replaced: a
    takeover goes through the rollout (cordon, drain) as a reload does. The pod is named on
    the node, so its successor is never taken for it."""
    return pod is not None and node_labels.get(keys.TT_STANDBY_POD_LABEL) == pod.name


def needs_rollout(
    node_labels: Mapping[str, str], pod: BuilderPod | None, target: DriverTarget
) -> bool:
    """A reload, or a takeover from DKMS: what only the rollout may do to a node."""
    return needs_reload(node_labels, target) or is_standing_by(node_labels, pod)


def is_outdated(pod: BuilderPod, target: DriverTarget) -> bool:
    """Whether the pod must be replaced for its node to run the target: it was made from an
    older template, or it keeps failing with the old forceUnload setting."""
    return pod.template_hash != target.template_hash or (
        pod.crash_loop and pod.force_unload != target.force_unload
    )


def builders_to_restart(
    nodes: Sequence[NodeView],
    pods: Mapping[str, BuilderPod],
    target: DriverTarget,
    state_key: str,
    budget: int,
) -> list[BuilderPod]:
    """The outdated builder pods to delete now on nodes that need no reload.

    As a DaemonSet's rolling update with ``maxUnavailable: budget``: a node the rollout does not
    hold whose builder is missing, going away or not Ready counts against the budget; an outdated
    builder that is not Ready loses nothing by being replaced and is replaced at once. Nodes the
    rollout holds are its own (its swap replaces their builder); nodes that are down wait, and
    so do skipped ones (their builder left).
    """
    outdated: list[BuilderPod] = []
    unavailable = 0
    for node in nodes:
        if not node.ready or node.labels.get(keys.TT_DRIVER_SKIP_LABEL) == "true":
            continue
        if parse_state(node.labels.get(state_key)) not in (None, State.DONE):
            continue
        pod = pods.get(node.name)
        if needs_rollout(node.labels, pod, target):
            continue
        if pod is None or pod.deleting:
            unavailable += 1
        elif is_outdated(pod, target):
            outdated.append(pod)
        elif not pod.ready:
            unavailable += 1
    broken = [p for p in outdated if not p.ready]
    healthy = sorted((p for p in outdated if p.ready), key=lambda p: p.node)
    return broken + healthy[: max(0, budget - unavailable - len(broken))]
