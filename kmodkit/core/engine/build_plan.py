"""In-cluster build plans: one build Job per missing image, retried with back-off.

KMM runs one build per kernel with no node selector (so headers may not match),
and a failed build pod blocks every retry until a human deletes it. Here a
build is a Job pinned to a node that runs the image's kernel and architecture;
a failure is retried after an exponentially growing pause, each attempt a new
Job whose name carries the attempt number, so the retry count survives an
operator restart. The newest Job of an image decides its state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kmodkit.core import labels
from kmodkit.core.api import Module, RegistryTLS
from kmodkit.core.engine.kernel_mapping import ResolvedMapping
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus
from kmodkit.core.engine.loader_pod import COMPONENT_LABEL, MODULE_LABEL
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.kernel import dns_safe
from kmodkit.core.nodes import NodeView, selector_matches

BUILD_COMPONENT = "module-build"
IMAGE_ANNOTATION = f"{labels.KMODKIT_PREFIX}/image"
ATTEMPT_ANNOTATION = f"{labels.KMODKIT_PREFIX}/build-attempt"
# How long a finished build may take to show up in the registry.
PUSH_GRACE_SECONDS = 60.0
MAX_CANDIDATE_NODES = 50


@dataclass(frozen=True)
class BuildSettings:
    builder_image: str
    backoff_base_seconds: float = 30.0
    backoff_max_seconds: float = 900.0
    deadline_seconds: int = 3600


@dataclass(frozen=True)
class BuildJob:
    """A build Job as observed."""

    name: str
    image: str
    attempt: int
    active: bool = False
    succeeded: bool = False
    failed: bool = False
    finished_at: float | None = None
    message: str = ""


def build_job_view(obj: Mapping[str, Any]) -> BuildJob:
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = obj.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    done = conds.get("Complete") or conds.get("Failed")
    return BuildJob(
        name=meta.get("name", ""),
        image=ann.get(IMAGE_ANNOTATION, ""),
        attempt=int(ann.get(ATTEMPT_ANNOTATION, "1") or 1),
        active=bool(status.get("active")),
        succeeded="Complete" in conds,
        failed="Failed" in conds,
        finished_at=_timestamp(done.get("lastTransitionTime")) if done else None,
        message=(conds["Failed"].get("message") or conds["Failed"].get("reason") or "")
        if "Failed" in conds
        else "",
    )


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class BuildPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    states: dict[str, ImageStatus] = field(default_factory=dict)
    requeue_after: float | None = None
    """Seconds until a retry is due, so the engine wakes for it."""


def backoff(attempt: int, settings: BuildSettings) -> float:
    return float(
        min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** max(0, attempt - 1))
    )


def job_name(module: str, image: str, attempt: int) -> str:
    digest = hashlib.sha256(image.encode()).hexdigest()[:10]
    return f"{module[:200]}-build-{digest}-{attempt}"


def plan_builds(
    module: Module,
    needed: Mapping[str, ResolvedMapping],
    nodes_by_image: Mapping[str, Sequence[NodeView]],
    all_nodes: Iterable[NodeView],
    existence: Mapping[str, Answer],
    jobs: Iterable[BuildJob],
    settings: BuildSettings,
    now: float,
) -> BuildPlan:
    out = BuildPlan()
    by_image: dict[str, list[BuildJob]] = {}
    for seen in jobs:
        by_image.setdefault(seen.image, []).append(seen)
    latest: dict[str, BuildJob] = {}
    for image, attempts in by_image.items():
        attempts.sort(key=lambda j: j.attempt)
        keep = 1 if image in needed else 0  # superseded attempts go
        if keep:
            latest[image] = attempts[-1]
        out.delete.extend(j.name for j in attempts[: len(attempts) - keep])
    nodes = list(all_nodes)
    for image, resolved in sorted(needed.items()):
        answer = existence.get(image, Answer(Existence.UNKNOWN, "not checked yet"))
        job = latest.get(image)
        if answer.existence is Existence.EXISTS:
            out.states[image] = ImageStatus(ImageState.EXISTS)
            continue
        if answer.existence is Existence.UNKNOWN:
            # Never build because the registry could not be asked.
            out.states[image] = ImageStatus(ImageState.UNKNOWN, answer.detail)
            continue
        if resolved.build is None:
            out.states[image] = ImageStatus(ImageState.MISSING)
            continue
        if job is not None and job.active:
            out.states[image] = ImageStatus(ImageState.BUILDING, job.name)
            continue
        if (
            job is not None
            and job.succeeded
            and job.finished_at is not None
            and now - job.finished_at < PUSH_GRACE_SECONDS
        ):
            out.states[image] = ImageStatus(
                ImageState.BUILDING, f"{job.name} finished; waiting for the registry"
            )
            _wake(out, PUSH_GRACE_SECONDS - (now - job.finished_at))
            continue
        if job is not None and (job.failed or job.succeeded):
            if job.failed:
                why = job.message or "the build Job failed"
            else:
                why = f"{job.name} succeeded but {image} is not in the registry"
            grace = 0.0 if job.failed else PUSH_GRACE_SECONDS
            due = (job.finished_at or now) + grace + backoff(job.attempt, settings)
            if now < due:
                out.states[image] = ImageStatus(
                    ImageState.BUILD_FAILED,
                    f"attempt {job.attempt} ({job.name}): {why}; retrying in {int(due - now)}s",
                )
                _wake(out, due - now)
                continue
        if job is not None and not (job.failed or job.succeeded):
            # Created but not started yet (no pod active): it is on its way.
            out.states[image] = ImageStatus(ImageState.BUILDING, job.name)
            continue
        attempt = job.attempt + 1 if job is not None else 1
        candidates = _build_nodes(resolved, nodes_by_image.get(image, ()), nodes)
        if not candidates:
            out.states[image] = ImageStatus(
                ImageState.BUILD_FAILED,
                f"no node runs kernel {resolved.kernel} and matches build.selector; the build "
                "needs one for matching kernel headers",
            )
            continue
        out.create.append(build_job(module, image, resolved, attempt, candidates, settings))
        out.states[image] = ImageStatus(
            ImageState.BUILDING, job_name(module.metadata.name or "", image, attempt)
        )
    return out


def _wake(out: BuildPlan, seconds: float) -> None:
    seconds = max(1.0, seconds)
    out.requeue_after = seconds if out.requeue_after is None else min(out.requeue_after, seconds)


def _build_nodes(
    resolved: ResolvedMapping, targeted: Sequence[NodeView], all_nodes: Sequence[NodeView]
) -> list[str]:
    """Nodes a build may run on: the image's kernel and architecture, build.selector."""
    assert resolved.build is not None
    arches = {n.arch for n in targeted} or {"amd64"}
    selector = resolved.build.selector or {}
    pool = targeted if not selector else all_nodes
    names = sorted(
        n.name
        for n in pool
        if n.kernel == resolved.kernel
        and n.arch in arches
        and n.ready
        and selector_matches(selector, n.labels)
    )
    return names[:MAX_CANDIDATE_NODES]


def _tls_flags(tls: RegistryTLS | None, push: bool) -> list[str]:
    if tls is None:
        return []
    suffix = "" if push else "-pull"
    flags = []
    if tls.insecure:
        flags.append(f"--insecure{suffix}")
    if tls.insecure_skip_tls_verify:
        flags.append(f"--skip-tls-verify{suffix}")
    return flags


def build_job(
    module: Module,
    image: str,
    resolved: ResolvedMapping,
    attempt: int,
    candidates: Sequence[str],
    settings: BuildSettings,
) -> dict[str, Any]:
    """A kaniko-compatible build Job that pushes ``image``."""
    assert resolved.build is not None
    build = resolved.build
    name, ns = module.metadata.name or "", module.metadata.namespace or ""
    args = [
        "--dockerfile=/workspace/Dockerfile",
        "--context=dir:///workspace",
        f"--destination={image}",
        *_tls_flags(resolved.registry_tls, push=True),
        *_tls_flags(build.base_image_registry_tls, push=False),
    ]
    for arg in build.build_args or []:
        args.append(f"--build-arg={arg.name}={arg.value}")
    mounts: list[dict[str, Any]] = [
        {"name": "dockerfile", "mountPath": "/workspace", "readOnly": True},
        {"name": "host-modules", "mountPath": "/host/lib/modules", "readOnly": True},
    ]
    volumes: list[dict[str, Any]] = [
        {
            "name": "dockerfile",
            "configMap": {
                "name": build.dockerfile_config_map.name,
                "items": [{"key": "dockerfile", "path": "Dockerfile"}],
            },
        },
        {"name": "host-modules", "hostPath": {"path": "/lib/modules", "type": "Directory"}},
    ]
    for i, secret in enumerate(build.secrets or []):
        mounts.append(
            {"name": f"secret-{i}", "mountPath": f"/run/secrets/{secret.name}", "readOnly": True}
        )
        volumes.append({"name": f"secret-{i}", "secret": {"secretName": secret.name}})
    if module.spec.image_repo_secret is not None:
        mounts.append({"name": "push-auth", "mountPath": "/kaniko/.docker", "readOnly": True})
        volumes.append(
            {
                "name": "push-auth",
                "secret": {
                    "secretName": module.spec.image_repo_secret.name,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        )
    meta_labels = {
        labels.MANAGED_BY_LABEL: labels.MANAGED_BY,
        COMPONENT_LABEL: BUILD_COMPONENT,
        MODULE_LABEL: name,
        labels.MODULE_NAME_LABEL: name,
        labels.TARGET_KERNEL_LABEL: dns_safe(resolved.kernel)[:63].strip("-."),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name, image, attempt),
            "namespace": ns,
            "labels": meta_labels,
            "annotations": {IMAGE_ANNOTATION: image, ATTEMPT_ANNOTATION: str(attempt)},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.deadline_seconds,
            "template": {
                "metadata": {"labels": meta_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    # matchFields takes one value per term; terms are ORed.
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": [node],
                                            }
                                        ]
                                    }
                                    for node in candidates
                                ]
                            }
                        }
                    },
                    "tolerations": [
                        t.model_dump(by_alias=True, exclude_none=True)
                        for t in module.spec.tolerations or []
                    ],
                    "containers": [
                        {
                            "name": "kaniko",
                            "image": settings.builder_image,
                            "args": args,
                            "volumeMounts": mounts,
                            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }
