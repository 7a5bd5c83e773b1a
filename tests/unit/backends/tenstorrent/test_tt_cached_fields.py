"""What the caches keep of the Tenstorrent backend's fleet-sized watched objects (builder pods,
flash pods and Jobs, one each per node) reads the same as the whole object.

Each case is a realistic object (the pod the builder DaemonSet's template makes, the Job the
hooks create) in a state where the field under test matters; the reader is asserted to see
that state in the whole object, so a case that reads only defaults cannot pass unseen.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kmodkit.backends import tenstorrent
from kmodkit.backends.tenstorrent import driver_plan, firmware_plan
from kmodkit.backends.tenstorrent.builder_pods import builder_pod
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.firmware_job import failure_text, flash_job, job_outcome
from kmodkit.backends.tenstorrent.flash_pods import image_pull_problems
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.core.contract.backend import ClusterView
from kmodkit.sdk import Obj
from tests.unit.backends.cached import as_cached

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
NS = "ops"


def _kept(name: str, obj: Obj) -> Obj:
    return as_cached(tenstorrent.backend, {name: [obj]})[name][0]


def _builder(node: str) -> dict[str, Any]:
    """The pod the DaemonSet controller makes from the driver policy's template, with the
    fields a stored pod has beside them."""
    body = {
        "metadata": {"name": "default", "generation": 1, "uid": "u"},
        "spec": {"version": "2.9.0", "nodeAffinity": {}, "upgradePolicy": {"forceUnload": True}},
    }
    view = ClusterView(nodes=[], api_groups=frozenset(), operator_namespace=NS, watched={})
    (ds,) = [o for o in driver_plan.plan_at(body, view, NOW).objects if o["kind"] == "DaemonSet"]
    template = copy.deepcopy(ds["spec"]["template"])
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": f"ttdrv-default-{node}",
            "namespace": NS,
            "uid": f"uid-{node}",
            "ownerReferences": [{"kind": "DaemonSet", "name": "ttdrv-default", "uid": "ds"}],
            "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {**template["spec"], "nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "sha256:0",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-11-30T08:00:00Z"}},
                }
                for c in template["spec"]["containers"]
            ],
        },
    }
    return pod


def _deleting(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2026-11-30T08:00:00Z"
    return pod


def _status(pod: dict[str, Any], **fields: Any) -> dict[str, Any]:
    pod["status"]["containerStatuses"][0].update(fields)
    return pod


def _not_ready(pod: dict[str, Any]) -> dict[str, Any]:
    (ready,) = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    ready["status"] = "False"
    return pod


HOLDERS = json.dumps({"message": "tenstorrent is in use", "holders": [{"pid": 7, "comm": "tt"}]})
BUILDER_CASES = {
    "ready, and forceUnload in its environment": (
        _builder("a"),
        lambda p: p.ready and p.force_unload and p.namespace == NS and p.template_hash,
    ),
    "being deleted": (
        _deleting(_builder("a")),
        lambda p: p.deleting,
    ),
    "restarted three times": (
        _not_ready(_status(_builder("a"), restartCount=3)),
        lambda p: p.crash_loop,
    ),
    "crash looping, its last words kept": (
        _not_ready(
            _status(
                _builder("a"),
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                lastState={"terminated": {"exitCode": 1, "message": HOLDERS}},
            )
        ),
        lambda p: p.crash_loop and "pid 7 (tt)" in p.last_error,
    ),
    "its image cannot be pulled": (
        _not_ready(_status(_builder("a"), state={"waiting": {"reason": "ImagePullBackOff"}})),
        lambda p: p.image_pull_problem == "ImagePullBackOff",
    ),
}


@pytest.mark.parametrize("case", BUILDER_CASES)
def test_a_kept_builder_pod_reads_as_the_whole_one(case: str) -> None:
    pod, shows = BUILDER_CASES[case]
    whole = builder_pod(pod)
    assert shows(whole), whole
    assert builder_pod(_kept(driver_plan.BUILDERS, pod)) == whole


def test_a_kept_builder_pod_is_a_small_part_of_it() -> None:
    pod = _builder("a")
    kept = _kept(driver_plan.BUILDERS, pod)
    assert len(json.dumps(kept)) * 3 < len(json.dumps(pod))
    assert "managedFields" not in kept["metadata"]


def _flash_pod(node: str, init: str, main: str) -> dict[str, Any]:
    waiting = [{"name": "c", "image": "i", "state": {"waiting": {"reason": init}}}]
    return {
        "metadata": {
            "name": f"flash-{node}",
            "namespace": NS,
            "labels": {"firmware.tenstorrent.com/cr": "fw", "job-name": f"flash-{node}"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "flash", "image": "i"}]},
        "status": {
            "initContainerStatuses": waiting,
            "containerStatuses": [{**waiting[0], "state": {"waiting": {"reason": main}}}],
        },
    }


def test_kept_flash_pods_show_the_same_image_pull_problems() -> None:
    pods = [
        _flash_pod("a", "ErrImagePull", "PodInitializing"),
        _flash_pod("b", "", "ImagePullBackOff"),
    ]
    whole = image_pull_problems(pods, "fw")
    assert whole == {"a": "ErrImagePull", "b": "ImagePullBackOff"}
    assert image_pull_problems([_kept(firmware_plan.FLASHERS, p) for p in pods], "fw") == whole


def test_finished_flash_pods_are_not_watched_and_would_show_no_problem() -> None:
    """A finished flash pod stays a day with its Job, on every node flashed: the watch leaves
    it to the apiserver, and the plan loses nothing by it."""
    waiting = _flash_pod("a", "ErrImagePull", "PodInitializing")
    pending = {**waiting, "status": {**waiting["status"], "phase": "Pending"}}
    finished = []
    for node, phase in (("b", "Succeeded"), ("c", "Failed")):
        pod = _flash_pod(node, "", "")
        done = {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1}}
        statuses = [{"name": "flash", "image": "i", "state": done}]
        pod["status"] = {"phase": phase, "initContainerStatuses": [], "containerStatuses": statuses}
        finished.append(pod)
    pods = [pending, *finished]
    (cached,) = as_cached(tenstorrent.backend, {firmware_plan.FLASHERS: pods}).values()
    assert [p["spec"]["nodeName"] for p in cached] == ["a"]
    assert (
        image_pull_problems(cached, "fw")
        == image_pull_problems(pods, "fw")
        == {"a": "ErrImagePull"}
    )


def _job(node: str, namespace: str = NS, **status: Any) -> dict[str, Any]:
    spec = TenstorrentFirmwarePolicySpec.model_validate({"version": "19.9.0", "nodeSelector": {}})
    owner = {"metadata": {"name": "fw", "uid": "policy-uid"}}
    settings = TenstorrentSettings.from_settings({})
    job = flash_job(owner, node, "1", namespace, spec, settings)
    job["metadata"]["managedFields"] = [{"manager": "kmodkit"}]
    job["status"] = status
    return job


DEADLINE = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}


def test_a_kept_flash_job_reads_as_the_whole_one() -> None:
    job = _job("a", conditions=[DEADLINE])
    job["metadata"]["deletionTimestamp"] = "2026-11-30T08:00:00Z"
    kept = _kept(firmware_plan.FLASH_JOBS, job)
    assert job_outcome(job) == "failed" and "flashTimeoutSeconds" in failure_text(job)
    assert (job_outcome(kept), failure_text(kept)) == (job_outcome(job), failure_text(job))
    meta = {k: v for k, v in job["metadata"].items() if k != "managedFields"}
    assert kept["metadata"] == meta  # the hooks' name, namespace, attempt, owner and deletion


def test_the_hooks_take_the_kept_jobs_of_the_operator_namespace_only() -> None:
    mine, foreign = _job("a"), _job("b", namespace="elsewhere")
    spec = {"version": "19.9.0", "nodeSelector": {}}
    body = {"metadata": {"name": "fw", "uid": "policy-uid"}, "spec": spec}
    view = ClusterView(
        nodes=[],
        api_groups=frozenset(),
        operator_namespace=NS,
        watched={
            firmware_plan.FLASH_JOBS: [_kept(firmware_plan.FLASH_JOBS, j) for j in (mine, foreign)]
        },
    )
    hooks = firmware_plan.hooks(body, view, None)
    assert list(hooks._jobs) == [mine["metadata"]["name"]]
