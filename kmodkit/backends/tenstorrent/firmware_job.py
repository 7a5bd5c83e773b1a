"""The flash Job: one per (policy, node, version), pinned to its node.

The Job's pod downloads the bundle, flashes it with tt-flash, resets the
chips and checks that tt-smi reads the new version back (see
dockerfiles/tenstorrent/flasher). ``activeDeadlineSeconds`` is the policy's
flashTimeoutSeconds, so a hung flash fails the Job, and the node, by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings

APP_NAME = "tt-flasher"
CONTAINER = "flash"
FINISHED_TTL_SECONDS = 86400
"""Finished Jobs go after a day; nodes remember what was flashed, so nothing is redone."""
WORK_DIR = "/work"
FIELDS = ("metadata", "spec.activeDeadlineSeconds", "status.conditions")
"""What the hooks read of a flash Job (``job_outcome``, ``failure_text``, its name, attempt,
owner and deletion)."""
UNSUCCEEDED = "status.successful!=1"
"""The flash Jobs watched: running or failed. A succeeded one stays a day, on every node
flashed (2 KB each in the cache), and is read once, from the apiserver, by the pass that
moves its node on (``FirmwareHooks._read_job``)."""


def job_labels(policy: str, node: str, version: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/component": "firmware",
        keys.TT_FIRMWARE_POLICY_LABEL: names.label_value(policy),
        keys.TT_FIRMWARE_NODE_LABEL: names.label_value(node),
        keys.TT_FIRMWARE_VERSION_LABEL: version.replace(".", "-"),
    }


def _flag(value: bool) -> str:
    return "true" if value else "false"


def flash_job(
    owner: Mapping[str, Any],
    node: str,
    attempt: str,
    namespace: str,
    spec: TenstorrentFirmwarePolicySpec,
    settings: TenstorrentSettings,
) -> dict[str, Any]:
    """The Job that flashes ``node`` for rollout ``attempt`` of the policy ``owner``."""
    meta = owner.get("metadata") or {}
    policy = str(meta.get("name", ""))
    flasher = spec.flasher
    job_meta_labels = job_labels(policy, node, spec.version)
    env = [
        {"name": "TT_FW_VERSION", "value": spec.version},
        {"name": "TT_FW_BUNDLE_URL", "value": spec.bundle()},
        {"name": "TT_FW_BUNDLE_PATH", "value": f"{WORK_DIR}/bundle.fwbundle"},
        {"name": "TT_FW_READBACK", "value": spec.readback()},
        {"name": "TT_FORCE_WRITE", "value": _flag(flasher.force_write)},
        {
            "name": "TT_CONTINUE_ON_READBACK_FAILURE",
            "value": _flag(flasher.continue_on_readback_failure),
        },
        {
            "name": "TT_HOMOGENIZE_FIRMWARE_VERSIONS",
            "value": _flag(flasher.homogenize_firmware_versions),
        },
        *settings.env(),
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.flash_job_name(policy, node, spec.version),
            "namespace": namespace,
            "labels": job_meta_labels,
            # No ownerReference: see firmware_deletion.
            "annotations": {
                keys.TT_FLASH_ATTEMPT_ANNOTATION: attempt,
                keys.TT_FLASH_POLICY_UID_ANNOTATION: str(meta.get("uid", "")),
            },
        },
        "spec": {
            # A half-done flash is not retried blindly: the node fails and says why.
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.upgrade_policy.flash_timeout_seconds,
            "ttlSecondsAfterFinished": FINISHED_TTL_SECONDS,
            "template": {
                "metadata": {"labels": {**(flasher.pod_labels or {}), **job_meta_labels}},
                "spec": {
                    "restartPolicy": "Never",
                    # Pinned, so it runs on a cordoned node (and only there).
                    "nodeName": node,
                    "tolerations": [{"operator": "Exists"}],
                    # The flasher never calls the Kubernetes API: no token to steal.
                    "serviceAccountName": settings.flasher_service_account,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": CONTAINER,
                            "image": flasher.image or settings.flasher_image,
                            "imagePullPolicy": flasher.image_pull_policy,
                            "command": ["/usr/local/bin/tt-flash-node"],
                            "env": env,
                            "securityContext": {"privileged": True},
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [
                                {"name": "work", "mountPath": WORK_DIR},
                                {"name": "sys", "mountPath": "/sys"},
                                {"name": "hugepages", "mountPath": "/dev/hugepages"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "work", "emptyDir": {}},
                        {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
                        {
                            "name": "hugepages",
                            "hostPath": {"path": "/dev/hugepages", "type": "DirectoryOrCreate"},
                        },
                    ],
                },
            },
        },
    }


def job_outcome(job: Mapping[str, Any]) -> str:
    """``succeeded``, ``failed`` or ``running``, from the Job's conditions."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if cond.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    return "running"


def failure_text(job: Mapping[str, Any]) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Failed", "FailureTarget") and cond.get("status") == "True":
            reason = str(cond.get("reason") or "")
            message = str(cond.get("message") or "")
            if reason == "DeadlineExceeded":
                seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
                return f"the flash did not finish within flashTimeoutSeconds ({seconds}s)"
            return f"{reason}: {message}".strip(": ")
    return "the flash Job failed"
