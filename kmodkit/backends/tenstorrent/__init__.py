"""Tenstorrent backend: tt-kmd, tt-smi and firmware rolled across the fleet.

Two cluster-scoped resources: ``TenstorrentDriverPolicy`` (a builder
DaemonSet that builds and loads tt-kmd on each node, upgraded one node at a
time) and ``TenstorrentFirmwarePolicy`` (one flash Job per node and version).
Both roll their change through the rollout core; see docs/tenstorrent.md.
"""

from functools import partial

from kmodkit.backends.tenstorrent import (
    builder_pods,
    driver_owners,
    driver_plan,
    firmware_deletion,
    firmware_job,
    firmware_plan,
    flash_pods,
    names,
)
from kmodkit.backends.tenstorrent.cli import tenstorrent as tenstorrent_commands
from kmodkit.backends.tenstorrent.driver_api import DRIVER_CRD, TenstorrentDriverPolicy
from kmodkit.backends.tenstorrent.driver_daemonset import APP_NAME as BUILDER_APP
from kmodkit.backends.tenstorrent.firmware_api import FIRMWARE_CRD, TenstorrentFirmwarePolicy
from kmodkit.backends.tenstorrent.firmware_job import APP_NAME as FLASHER_APP
from kmodkit.backends.tenstorrent.keys import TT_DRIVER_SKIP_LABEL, TT_FIRMWARE_SKIP_LABEL
from kmodkit.backends.tenstorrent.validation import problems_of
from kmodkit.sdk import CONTRACT_VERSION, Backend, OwnedKind, Resource, RolloutControls, Watch

backend = Backend(
    name="tenstorrent",
    version="0.1.0",
    contract=CONTRACT_VERSION,
    description="Tenstorrent tt-kmd driver, tt-smi and firmware",
    commands=(tenstorrent_commands,),
    resources=(
        Resource(
            crd=DRIVER_CRD,
            model=TenstorrentDriverPolicy,
            plan=driver_plan.plan,
            owns=(
                OwnedKind("apps/v1", "DaemonSet", "daemonsets"),
                OwnedKind("v1", "ConfigMap", "configmaps"),
            ),
            watches=(
                Watch(
                    name=driver_plan.BUILDERS,
                    group="",
                    version="v1",
                    plural="pods",
                    labels={"app.kubernetes.io/name": BUILDER_APP},
                    fields=builder_pods.FIELDS,
                ),
                Watch(
                    name=driver_plan.POLICIES,
                    group=DRIVER_CRD.group,
                    version=DRIVER_CRD.version,
                    plural=DRIVER_CRD.plural,
                ),
                Watch(
                    name=driver_plan.BUILDER_SETS,
                    group="apps",
                    version="v1",
                    plural="daemonsets",
                    labels={"app.kubernetes.io/name": BUILDER_APP},
                    # Read for handovers only; the builder pods' events and the requeue of a
                    # node waiting for one cover its changes, and its status moves with
                    # every pod.
                    wakes=False,
                ),
            ),
            hooks=driver_plan.hooks,
            node_labels=driver_owners.node_labels,
            rollout_status=driver_plan.rollout_status,
            validate=partial(problems_of, TenstorrentDriverPolicy),
            controls=RolloutControls(
                policy_id=names.driver_policy_id,
                pause_field="paused",
                skip_label=TT_DRIVER_SKIP_LABEL,
            ),
        ),
        Resource(
            crd=FIRMWARE_CRD,
            model=TenstorrentFirmwarePolicy,
            plan=firmware_plan.plan,
            watches=(
                Watch(
                    name=firmware_plan.FLASHERS,
                    group="",
                    version="v1",
                    plural="pods",
                    labels={"app.kubernetes.io/name": FLASHER_APP},
                    field_selector=flash_pods.UNFINISHED,
                    fields=flash_pods.FIELDS,
                ),
                Watch(
                    name=firmware_plan.POLICIES,
                    group=FIRMWARE_CRD.group,
                    version=FIRMWARE_CRD.version,
                    plural=FIRMWARE_CRD.plural,
                ),
                Watch(
                    name=firmware_plan.FLASH_JOBS,
                    group="batch",
                    version="v1",
                    plural="jobs",
                    labels={"app.kubernetes.io/name": FLASHER_APP},
                    field_selector=firmware_job.UNSUCCEEDED,
                    fields=firmware_job.FIELDS,
                ),
            ),
            hooks=firmware_plan.hooks,
            node_labels=firmware_plan.node_labels,
            rollout_status=firmware_plan.rollout_status,
            validate=partial(problems_of, TenstorrentFirmwarePolicy),
            hold_deletion=firmware_deletion.hold_deletion,
            controls=RolloutControls(
                policy_id=names.firmware_policy_id,
                pause_field="paused",
                skip_label=TT_FIRMWARE_SKIP_LABEL,
            ),
        ),
    ),
)
