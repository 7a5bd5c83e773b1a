"""The firmware rollout's hooks: which nodes need a flash, the flash Job, and its result.

What a node runs is remembered on the node itself (the ``current-version``
annotation, written when its flash Job succeeds), not in the Job: finished
Jobs are deleted after a day, and a node must not be flashed again for that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.drain_rules import is_device_consumer
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.firmware_job import failure_text, flash_job, job_outcome
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.sdk import Failed, Obj, Pending, RolloutKeys, Validated, Validation


@dataclass(frozen=True)
class FirmwareTarget:
    policy: str
    readback: str
    auto_upgrade: bool
    force_request: int | None
    """The forceWrite request in force, or None when forceWrite is off."""

    @property
    def force_marker(self) -> str:
        return f"{self.policy}/{self.force_request}"


def needs_flash(annotations: Mapping[str, str], target: FirmwareTarget) -> bool:
    if not target.auto_upgrade:
        return False
    if annotations.get(keys.TT_FW_CURRENT_VERSION_ANNOTATION) != target.readback:
        return True
    return (
        target.force_request is not None
        and annotations.get(keys.TT_FW_FORCED_ANNOTATION) != target.force_marker
    )


def _meta(node: Obj) -> Mapping[str, Any]:
    return node.get("metadata") or {}


class FirmwareHooks:
    """``kmodkit.sdk.RolloutHooks`` for one firmware policy."""

    def __init__(
        self,
        api: Any,
        owner: Obj,
        spec: TenstorrentFirmwarePolicySpec,
        settings: TenstorrentSettings,
        namespace: str,
        target: FirmwareTarget,
        jobs: Mapping[str, Obj] | None = None,
    ) -> None:
        """``jobs``: the flash Jobs of the operator namespace by name, as the watch shows
        them (the pass reads each node's Job there, and asks the apiserver only for one
        the watch does not show)."""
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._owner = owner
        self._uid = str(_meta(owner).get("uid", ""))
        self._spec = spec
        self._settings = settings
        self._namespace = namespace
        self._target = target
        self._keys = RolloutKeys.for_policy(names.firmware_policy_id(target.policy))
        self._jobs = jobs or {}

    def needs_update(self, node: Obj) -> bool:
        return needs_flash(_meta(node).get("annotations") or {}, self._target)

    def is_device_consumer(self, pod: Obj) -> bool:
        return is_device_consumer(pod)

    def _identity(self, node: Obj) -> str:
        """Which start of the rollout on this node a Job belongs to: a retry or a forced
        re-flash gets a fresh Job, a repeated swap after a crash keeps the one it made."""
        annotations = _meta(node).get("annotations") or {}
        return (
            f"{annotations.get(self._keys.attempt, '0')}@{annotations.get(self._keys.target, '')}"
        )

    def _job_name(self, node: Obj) -> str:
        return names.flash_job_name(
            self._target.policy, str(_meta(node).get("name")), self._spec.version
        )

    def _read_job(self, name: str) -> Obj | None:
        """The Job as the watch shows it; read from the apiserver only when the watch shows
        none (not made yet, made after the cache's last event, or succeeded: the watch
        leaves succeeded Jobs out, and the pass that reads one moves its node on): a GET per
        node in flight and pass was most of a fleet's firmware rollout. A cached Job behind
        the apiserver says "running" a pass longer, and the watch's event of its end wakes
        the next pass; whose attempt it is, its annotations say, and they never change."""
        if name in self._jobs:
            return self._jobs[name]
        try:
            job: Any = self._batch.read_namespaced_job(
                name, self._namespace, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(json.loads(job.data))

    def _ensure_job(self, node: Obj) -> Obj | None:
        """The node's Job for this attempt, created (or an older attempt's replaced) as needed;
        None while an older one is being removed."""
        name = self._job_name(node)
        identity = self._identity(node)
        job = self._read_job(name)
        if job is not None:
            annotations = _meta(job).get("annotations") or {}
            # A Job from before the owner uid was recorded is taken as this policy's.
            owner = annotations.get(keys.TT_FLASH_POLICY_UID_ANNOTATION, self._uid)
            if owner == self._uid and annotations.get(keys.TT_FLASH_ATTEMPT_ANNOTATION) == identity:
                return job
            if owner != self._uid and job_outcome(job) == "running":
                return None  # an earlier policy's flash is never cut short
            if _meta(job).get("deletionTimestamp") is None:
                try:
                    self._batch.delete_namespaced_job(
                        name, self._namespace, propagation_policy="Background"
                    )
                except ApiException as err:
                    if err.status != 404:  # gone since the watch showed it
                        raise
            return None
        manifest = flash_job(
            self._owner,
            str(_meta(node).get("name")),
            identity,
            self._namespace,
            self._spec,
            self._settings,
        )
        try:
            self._batch.create_namespaced_job(self._namespace, cast(Any, manifest))
        except ApiException as err:
            if err.status == 409:
                return None
            raise
        return manifest

    def swap(self, node: Obj) -> None:
        if self._ensure_job(node) is None:
            raise RuntimeError(f"replacing the previous flash Job {self._job_name(node)}")

    def validate(self, node: Obj) -> Validation:
        job = self._ensure_job(node)
        if job is None:
            return Pending("replacing the previous flash Job")
        outcome = job_outcome(job)
        name = str(_meta(job).get("name"))
        if outcome == "failed":
            detail = self._pod_message(name)
            text = failure_text(job) + (f"; flasher said: {detail}" if detail else "")
            return Failed("FlashJobFailed", f"flash Job {name}: {text}")
        if outcome == "running":
            return Pending(f"flash Job {name} is running")
        return self._flashed(name)

    def _pod_message(self, job_name: str) -> str:
        pods = self._core.list_namespaced_pod(
            self._namespace, label_selector=f"job-name={job_name}"
        ).items
        for pod in pods:
            for status in (pod.status.container_statuses if pod.status else None) or []:
                terminated = status.state.terminated if status.state else None
                if terminated is not None and terminated.message:
                    return str(terminated.message).strip().splitlines()[-1][:400]
        return ""

    def _flashed(self, job_name: str) -> Validated:
        """The node is healthy; what it runs now is recorded with its move on."""
        annotations = {
            keys.TT_FW_CURRENT_VERSION_ANNOTATION: self._target.readback,
            keys.TT_FW_LAST_JOB_ANNOTATION: job_name,
        }
        if self._target.force_request is not None:
            annotations[keys.TT_FW_FORCED_ANNOTATION] = self._target.force_marker
        return Validated(
            labels={keys.TT_FW_VERSION_LABEL: self._target.readback}, annotations=annotations
        )
