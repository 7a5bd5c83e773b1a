"""In-cluster build and sign plans: one Job per missing image, retried with back-off.

KMM runs one build per kernel with no node selector (so headers may not match),
and a failed build pod blocks every retry until a human deletes it. Here a
build is a Job pinned to a node that runs the image's kernel and architecture;
a failure is retried after an exponentially growing pause, each attempt a new
Job whose name carries the attempt number, so the retry count survives an
operator restart. The newest Job of an image decides its state.

Each Job records what it was made from (a digest of the Dockerfile text and
of what the build reads: build args, secrets, TLS, push credentials) and the
imageRebuildTriggerGeneration it was made under. A running build whose inputs
changed is replaced; a failed one is retried at once, without back-off, when
its inputs or the trigger changed.

A signed image takes two steps, each a Job of the same kind: the build (if any)
pushes the unsigned image, then the sign Job pushes the signed one under the
Module's image. Unlike KMM, whose build pushes the unsigned modules under the
final name and signs over them, no node can pull an unsigned image by the name
it loads: the signed image exists only once it is whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kmodkit.core import labels
from kmodkit.core.api import Build, Module, RegistryTLS
from kmodkit.core.engine import sign_job
from kmodkit.core.engine.kernel_mapping import ResolvedMapping
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus
from kmodkit.core.engine.loader_pod import COMPONENT_LABEL, MODULE_LABEL
from kmodkit.core.engine.registry import Answer, Existence, tls_flags
from kmodkit.core.kernel import dns_safe
from kmodkit.core.nodes import NodeView, selector_matches

BUILD_COMPONENT = "module-build"
IMAGE_ANNOTATION = f"{labels.KMODKIT_PREFIX}/image"
ATTEMPT_ANNOTATION = f"{labels.KMODKIT_PREFIX}/build-attempt"
INPUTS_ANNOTATION = f"{labels.KMODKIT_PREFIX}/build-inputs"
"""A digest of what the build reads: the Dockerfile text, build args, secrets, TLS, login."""
TRIGGER_ANNOTATION = f"{labels.KMODKIT_PREFIX}/rebuild-trigger"
"""The spec.imageRebuildTriggerGeneration the Job was made under (absent: none was set)."""
RETRY_ANNOTATION = f"{labels.KMODKIT_PREFIX}/build-retry"
"""How many failed Jobs of the same inputs and trigger came just before: the back-off step."""
REPORTED_ANNOTATION = f"{labels.KMODKIT_PREFIX}/build-reported"
"""The build events already posted about the Job, comma-separated."""
STEP_ANNOTATION = f"{labels.KMODKIT_PREFIX}/image-step"
"""What the Job does to make its image: build it, or sign the unsigned one (absent: build)."""
BUILD, SIGN = "build", "sign"
DOCKERFILE_KEY = "dockerfile"
STARTED, SUCCEEDED, FAILED = "started", "succeeded", "failed"
_EVENT_PREFIX = {BUILD: "Build", SIGN: "Sign"}
_NOT_CHECKED = Answer(Existence.UNKNOWN, "not checked yet")
# How long a finished build may take to show up in the registry.
PUSH_GRACE_SECONDS = 60.0
PUSH_RECHECK_SECONDS = 5.0
"""How often the registry is asked, in that grace, for the image a finished Job pushed."""
MAX_CANDIDATE_NODES = 50


@dataclass(frozen=True)
class BuildSettings:
    builder_image: str
    backoff_base_seconds: float = 30.0
    backoff_max_seconds: float = 900.0
    deadline_seconds: int = 3600
    input_recheck_seconds: float = 30.0
    """How often a running build's Dockerfile is read again (nothing watches ConfigMaps)."""
    signer_image: str = ""
    """The image that runs ``kmodkit-sign`` in sign Jobs."""
    registry_ca_config_map: str = ""
    """A ConfigMap in the Module's namespace whose ``registry_ca_key`` holds CA
    certificates build and sign Jobs trust for their registries besides the system's
    (empty: none)."""
    registry_ca_key: str = "ca.crt"


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
    inputs: str | None = None
    """The inputs digest; None for a Job made before Jobs recorded it (never replaced)."""
    trigger: int | None = None
    """None also for a Job made before Jobs recorded it: failed, it is retried at once if
    the Module has a trigger set (once, after an upgrade)."""
    retry: int = 0
    started: bool = False
    """The Job controller made its pod (it is active or has finished one)."""
    reported: frozenset[str] = frozenset()
    step: str = BUILD


def build_job_view(obj: Mapping[str, Any]) -> BuildJob:
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = obj.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    done = conds.get("Complete") or conds.get("Failed")
    attempt = _count(ann.get(ATTEMPT_ANNOTATION)) or 1
    inputs = ann.get(INPUTS_ANNOTATION) or None
    retry = _count(ann.get(RETRY_ANNOTATION))
    # A Job made before build events existed has had its news told (or lost) already:
    # reporting it now would repeat stale news for every kept Job at an upgrade.
    reported = (
        frozenset((ann.get(REPORTED_ANNOTATION) or "").split(",")) - {""}
        if inputs is not None
        else frozenset({STARTED, SUCCEEDED, FAILED})
    )
    return BuildJob(
        name=meta.get("name", ""),
        image=ann.get(IMAGE_ANNOTATION, ""),
        attempt=attempt,
        active=bool(status.get("active")),
        succeeded="Complete" in conds,
        failed="Failed" in conds,
        finished_at=_timestamp(done.get("lastTransitionTime")) if done else None,
        message=(conds["Failed"].get("message") or conds["Failed"].get("reason") or "")
        if "Failed" in conds
        else "",
        inputs=inputs,
        trigger=_count(ann.get(TRIGGER_ANNOTATION)),
        # Older Jobs counted every attempt towards the back-off.
        retry=attempt - 1 if retry is None else retry,
        started=bool(status.get("active") or status.get("succeeded") or status.get("failed")),
        reported=reported,
        step=SIGN if ann.get(STEP_ANNOTATION) == SIGN else BUILD,
    )


def _count(value: str | None) -> int | None:
    """A count from an annotation; None when absent or not a count (hand-edited)."""
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number >= 0 else None


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class BuildEvent:
    """An Event to post on the Module."""

    reason: str
    message: str
    warning: bool = False
    job: str = ""
    """The build Job it is about."""


@dataclass
class BuildPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    states: dict[str, ImageStatus] = field(default_factory=dict)
    requeue_after: float | None = None
    """Seconds until a retry is due, so the engine wakes for it."""
    events: list[BuildEvent] = field(default_factory=list)
    reported: dict[str, str] = field(default_factory=dict)
    """Job name -> the REPORTED_ANNOTATION value to record once ``events`` are posted."""


def backoff(attempt: int, settings: BuildSettings) -> float:
    return float(
        min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** max(0, attempt - 1))
    )


def job_name(module: str, image: str, attempt: int, step: str = BUILD) -> str:
    digest = hashlib.sha256(image.encode()).hexdigest()[:10]
    return f"{module[:200]}-{step}-{digest}-{attempt}"


def image_targets(needed: Mapping[str, ResolvedMapping]) -> dict[str, ResolvedMapping]:
    """Every image a Job may push for ``needed``: the images, and the unsigned images built
    to be signed."""
    targets = dict(needed)
    for resolved in needed.values():
        if resolved.sign is not None and resolved.build is not None:
            targets.setdefault(resolved.sign.unsigned_image, resolved)
    return targets


def unsigned_images(
    needed: Mapping[str, ResolvedMapping], existence: Mapping[str, Answer]
) -> dict[str, ResolvedMapping]:
    """The unsigned images whose existence decides the next step: those of signed images
    the registry does not have."""
    return {
        resolved.sign.unsigned_image: resolved
        for image, resolved in needed.items()
        if resolved.sign is not None
        and existence.get(image, _NOT_CHECKED).existence is Existence.MISSING
    }


def _next_step(
    image: str, resolved: ResolvedMapping, existence: Mapping[str, Answer]
) -> tuple[str, str] | ImageStatus:
    """The Job that makes a missing ``image`` next, as (step, image it pushes), or the
    image's state when no Job can."""
    sign = resolved.sign
    if sign is None:
        return (BUILD, image) if resolved.build is not None else ImageStatus(ImageState.MISSING)
    unsigned = existence.get(sign.unsigned_image, _NOT_CHECKED)
    if unsigned.existence is Existence.EXISTS:
        return SIGN, image
    if unsigned.existence is Existence.UNKNOWN:
        return ImageStatus(
            ImageState.UNKNOWN, f"the unsigned image {sign.unsigned_image}: {unsigned.detail}"
        )
    if resolved.build is not None:
        return BUILD, resolved.build_target
    return ImageStatus(
        ImageState.MISSING, f"the unsigned image {sign.unsigned_image} does not exist either"
    )


def plan_builds(
    module: Module,
    needed: Mapping[str, ResolvedMapping],
    nodes_by_image: Mapping[str, Sequence[NodeView]],
    all_nodes: Iterable[NodeView],
    existence: Mapping[str, Answer],
    jobs: Iterable[BuildJob],
    dockerfile: Callable[[str], str | None],
    settings: BuildSettings,
    now: float,
) -> BuildPlan:
    """Jobs to create and delete, image states, and the build and sign events to post.

    ``existence`` answers for the needed images and, for signed ones the
    registry lacks, their unsigned images (``unsigned_images``). ``dockerfile``
    gives the ``dockerfile`` key of a ConfigMap in the Module's namespace (None
    if there is none); it is asked only when a build's inputs matter, so a
    converged Module reads no ConfigMap.
    """
    out = BuildPlan()
    targets = image_targets(needed)
    by_image: dict[str, list[BuildJob]] = {}
    for seen in jobs:
        by_image.setdefault(seen.image, []).append(seen)
    latest: dict[str, BuildJob] = {}
    for image, attempts in by_image.items():
        attempts.sort(key=lambda j: j.attempt)
        keep = 1 if image in targets else 0  # superseded attempts go
        if keep:
            latest[image] = attempts[-1]
        out.delete.extend(j.name for j in attempts[: len(attempts) - keep])
    nodes = list(all_nodes)
    created: list[BuildEvent] = []
    late_failures: dict[str, str] = {}
    for image, resolved in sorted(needed.items()):
        answer = existence.get(image, _NOT_CHECKED)
        if answer.existence is Existence.EXISTS:
            out.states[image] = ImageStatus(ImageState.EXISTS)
            continue
        if answer.existence is Existence.UNKNOWN:
            # Never build because the registry could not be asked.
            out.states[image] = ImageStatus(ImageState.UNKNOWN, answer.detail)
            continue
        step = _next_step(image, resolved, existence)
        if isinstance(step, ImageStatus):
            out.states[image] = step
            continue
        kind, target = step
        job = latest.get(target)
        inputs = _inputs_reader(kind, module, target, resolved, dockerfile)
        building, failed = (
            (ImageState.BUILDING, ImageState.BUILD_FAILED)
            if kind == BUILD
            else (ImageState.SIGNING, ImageState.SIGN_FAILED)
        )
        retry, why_now, replaces = 0, "", None
        settings_of = "Dockerfile or build settings" if kind == BUILD else "sign settings"
        if job is not None and not (job.failed or job.succeeded):
            # Running, or created and not started yet.
            if not _changed(job, kind, inputs):
                out.states[image] = ImageStatus(building, job.name)
                _wake(out, settings.input_recheck_seconds)
                continue
            replaces = job.name
            why_now = f"; replaces {job.name}, whose {settings_of} changed"
        elif (
            job is not None
            and job.succeeded
            and job.finished_at is not None
            and now - job.finished_at < PUSH_GRACE_SECONDS
        ):
            out.states[image] = ImageStatus(
                building, f"{job.name} finished; waiting for the registry"
            )
            # Nothing is watched in the registry: ask again soon, not only at the grace's end.
            _wake(out, min(PUSH_RECHECK_SECONDS, PUSH_GRACE_SECONDS - (now - job.finished_at)))
            continue
        elif job is not None:
            if job.failed:
                why = job.message or f"the {kind} Job failed"
            else:
                why = f"{job.name} succeeded but {target} is not in the registry"
                late_failures[job.name] = (
                    f"it succeeded but {target} was not in the registry "
                    f"{int(PUSH_GRACE_SECONDS)}s later"
                )
            if _changed(job, kind, inputs):
                why_now = f"; {job.name} failed, and the {settings_of} changed since"
            elif job.trigger != module.spec.image_rebuild_trigger_generation:
                why_now = f"; imageRebuildTriggerGeneration changed since {job.name} failed"
            else:
                grace = 0.0 if job.failed else PUSH_GRACE_SECONDS
                due = (job.finished_at or now) + grace + backoff(job.retry + 1, settings)
                if now < due:
                    out.states[image] = ImageStatus(
                        failed,
                        f"attempt {job.attempt} ({job.name}): {why}; retrying in {int(due - now)}s",
                    )
                    _wake(out, due - now)
                    continue
                retry = job.retry + 1
        digest = inputs()
        if digest is None:
            config_map = resolved.build.dockerfile_config_map.name if resolved.build else ""
            out.states[image] = ImageStatus(
                failed,
                f"ConfigMap {module.metadata.namespace}/{config_map} has no key "
                f"{DOCKERFILE_KEY!r}: create it with the Dockerfile under that key",
            )
            _wake(out, settings.input_recheck_seconds)
            continue
        attempt = job.attempt + 1 if job is not None else 1
        targeted = nodes_by_image.get(image, ())
        if kind == BUILD:
            candidates = _build_nodes(resolved, targeted, nodes)
            if not candidates:
                out.states[image] = ImageStatus(
                    failed,
                    f"no node runs kernel {resolved.kernel} and matches build.selector; the "
                    "build needs one for matching kernel headers",
                )
                continue
            new = build_job(module, target, resolved, attempt, candidates, settings, digest, retry)
        else:
            arch = min((n.arch for n in targeted), default="amd64")
            new = sign_job_for(module, target, resolved, attempt, arch, settings, digest, retry)
        if replaces is not None:
            # Only once its successor can be made: a Job of old inputs beats none.
            out.delete.append(replaces)
        out.create.append(new)
        name = new["metadata"]["name"]
        out.states[image] = ImageStatus(building, name)
        doing = f"building {target}" if kind == BUILD else f"signing {image}"
        created.append(
            BuildEvent(f"{_EVENT_PREFIX[kind]}Created", f"{doing} in Job {name}{why_now}", job=name)
        )
    for job in latest.values():
        if job.name not in out.delete:
            _report(out, job, late_failures.get(job.name))
    out.events.extend(created)
    return out


def _inputs_reader(
    kind: str,
    module: Module,
    target: str,
    resolved: ResolvedMapping,
    dockerfile: Callable[[str], str | None],
) -> Callable[[], str | None]:
    """The digest of what a Job of ``kind`` for ``target`` would read, computed on demand;
    None while a build's Dockerfile cannot be read."""
    if kind == SIGN:
        return lambda: sign_inputs(module, target, resolved)
    assert resolved.build is not None
    config_map = resolved.build.dockerfile_config_map.name or ""

    def read() -> str | None:
        text = dockerfile(config_map)
        return None if text is None else build_inputs(module, target, resolved, text)

    return read


def _changed(job: BuildJob, kind: str, inputs: Callable[[], str | None]) -> bool:
    """Whether the Job was made from other inputs than a Job now would be.

    A Job of the other step always is. Unknown counts as unchanged: a Job made
    before inputs were recorded, or a Dockerfile that cannot be read now, never
    stops a build.
    """
    if job.step != kind:
        return True
    if job.inputs is None:
        return False
    now = inputs()
    return now is not None and job.inputs != now


def _report(out: BuildPlan, job: BuildJob, late_failure: str | None) -> None:
    """BuildStarted, BuildSucceeded, BuildFailed (Sign... for sign Jobs): each once per Job,
    as its annotation says.

    The controller posts the events and then records them on the Job. Killed in
    between, a restarted operator posts them again: an event may repeat, rarely,
    but is never lost. The Job is the record because it is what the events are
    about, lives exactly as long as they matter, and survives the operator.
    """
    told = set(job.reported)
    about = f"Job {job.name} (attempt {job.attempt}) for {job.image}"
    kind = _EVENT_PREFIX[job.step]
    if job.started and STARTED not in told:
        out.events.append(BuildEvent(f"{kind}Started", f"{about} started", job=job.name))
        told.add(STARTED)
    if job.succeeded and SUCCEEDED not in told:
        out.events.append(BuildEvent(f"{kind}Succeeded", f"{about} succeeded", job=job.name))
        told.add(SUCCEEDED)
    failure = (job.message or "the Job failed") if job.failed else late_failure
    if failure and FAILED not in told:
        out.events.append(
            BuildEvent(f"{kind}Failed", f"{about} failed: {failure}", warning=True, job=job.name)
        )
        told.add(FAILED)
    if told != job.reported:
        out.reported[job.name] = ",".join(
            kind for kind in (STARTED, SUCCEEDED, FAILED) if kind in told
        )


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


def build_inputs(module: Module, image: str, resolved: ResolvedMapping, dockerfile: str) -> str:
    """The digest a build Job records of what it reads.

    What the build reads, in the builder's terms rather than its flags: the
    Dockerfile text, the ConfigMap's name, build args, the build secrets' names,
    push and pull TLS, the push credentials' Secret. Not the candidate nodes, the
    builder image or the builder's command line: they change (a kanikoParams.tag,
    a new builder) without changing the image built, and a new digest would
    replace every running build and retry every failed one at once.
    """
    text = json.dumps([_build_reads(module, image, resolved), dockerfile], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _build_reads(module: Module, image: str, resolved: ResolvedMapping) -> dict[str, Any]:
    assert resolved.build is not None
    build = resolved.build
    secret = module.spec.image_repo_secret
    return {
        "image": image,
        "configMap": build.dockerfile_config_map.name,
        "buildArgs": [[arg.name, arg.value] for arg in build.build_args or []],
        "secrets": [s.name for s in build.secrets or []],
        "pushTLS": _tls(resolved.registry_tls),
        "pullTLS": _tls(build.base_image_registry_tls),
        "pushSecret": secret.name if secret is not None else None,
    }


def _tls(tls: RegistryTLS | None) -> list[bool]:
    """registryTLS as what it does, so an explicit ``false`` equals an absent field."""
    return [bool(tls and tls.insecure), bool(tls and tls.insecure_skip_tls_verify)]


WORKSPACE = "/workspace"
HOST_MODULES = "/host/lib/modules"
AUTH_DIR = "/run/kmodkit/registry-auth"
CA_DIR = "/etc/kmodkit/registry-ca"
CA_MOUNT = {"name": "registry-ca", "mountPath": CA_DIR, "readOnly": True}
STORAGE_DIR = "/var/lib/containers"
BUILDER_CAPABILITIES = (
    # buildah's default capabilities for RUN steps (Docker's build set): a
    # Dockerfile's RUN behaves as under `docker build`, and buildah cannot hand
    # its RUN steps a capability its own bounding set lacks.
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
    # The chroot isolation makes a mount namespace per RUN step and binds /proc,
    # /sys, /dev and the --run-volume directories into it. Without SYS_ADMIN
    # buildah falls back to making a user namespace, which fails in a container
    # (unshare(CLONE_NEWUSER): EPERM, tried) and which the runtime's default
    # seccomp profile refuses anyway.
    "SYS_ADMIN",
)


def _builder(
    module: Module, image: str, resolved: ResolvedMapping, settings: BuildSettings
) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """kmodkit-build's arguments, volume mounts and volumes for building ``image``.

    The build secrets and the host's /lib/modules are where KMM's kaniko pod had
    them, and bound into the RUN steps at the same paths (kaniko's RUN steps saw
    the pod's files; buildah's see only what is bound in).
    """
    assert resolved.build is not None
    build = resolved.build
    args = [
        f"--destination={image}",
        f"--dockerfile={WORKSPACE}/Dockerfile",
        f"--context={WORKSPACE}",
        *tls_flags(resolved.registry_tls, push=True),
        *tls_flags(build.base_image_registry_tls, push=False),
    ]
    for arg in build.build_args or []:
        args.append(f"--build-arg={arg.name}={arg.value}")
    mounts: list[dict[str, Any]] = [
        {"name": "dockerfile", "mountPath": WORKSPACE, "readOnly": True},
        {"name": "host-modules", "mountPath": HOST_MODULES, "readOnly": True},
        {"name": "build-storage", "mountPath": STORAGE_DIR},
    ]
    volumes: list[dict[str, Any]] = [
        {
            "name": "dockerfile",
            "configMap": {
                "name": build.dockerfile_config_map.name,
                "items": [{"key": DOCKERFILE_KEY, "path": "Dockerfile"}],
            },
        },
        {"name": "host-modules", "hostPath": {"path": "/lib/modules", "type": "Directory"}},
        # vfs copies every layer whole: on the node's disk, not the container's layer.
        {"name": "build-storage", "emptyDir": {}},
    ]
    args.append(f"--run-volume={HOST_MODULES}:{HOST_MODULES}")
    for i, secret in enumerate(build.secrets or []):
        path = f"/run/secrets/{secret.name}"
        mounts.append({"name": f"secret-{i}", "mountPath": path, "readOnly": True})
        volumes.append({"name": f"secret-{i}", "secret": {"secretName": secret.name}})
        args.append(f"--run-volume={path}:{path}")
    if module.spec.image_repo_secret is not None:
        mounts.append({"name": "registry-auth", "mountPath": AUTH_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "registry-auth",
                "secret": {
                    "secretName": module.spec.image_repo_secret.name,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        )
        args.append(f"--authfile={AUTH_DIR}/config.json")
    if settings.registry_ca_config_map:
        mounts.append(dict(CA_MOUNT))
        volumes.append(_registry_ca_volume(settings))
        args.append(f"--cert-dir={CA_DIR}")
    return args, mounts, volumes


def _registry_ca_volume(settings: BuildSettings) -> dict[str, Any]:
    # Optional: without it the Job fails at the registry with a certificate error, in
    # its status, instead of waiting on the volume.
    return {
        "name": "registry-ca",
        "configMap": {
            "name": settings.registry_ca_config_map,
            "items": [{"key": settings.registry_ca_key, "path": "ca.crt"}],
            "optional": True,
        },
    }


def builder_image(configured: str, build: Build | None) -> str:
    """The builder image, with ``kanikoParams.tag`` (KMM's name, kept) in place of its tag
    (or digest): it tags kmodkit's buildah builder image now. Unlike KMM, which cuts at
    the first ':' or '@', a registry port stays where it is."""
    tag = build.kaniko_params.tag if build and build.kaniko_params else None
    if tag is None:
        return configured
    repository = configured.split("@", 1)[0]
    name_start = repository.rfind("/") + 1
    if ":" in repository[name_start:]:
        repository = repository[: name_start + repository[name_start:].index(":")]
    return f"{repository}:{tag}"


def sign_inputs(module: Module, image: str, resolved: ResolvedMapping) -> str:
    """The digest a sign Job records: the signer's arguments and volumes, so the files, the
    images, their TLS and the Secrets' names. Not the key's bytes: the operator never reads
    them (to sign again with a rotated key under the same Secret, change
    imageRebuildTriggerGeneration while the image is missing, or delete the image)."""
    text = json.dumps(
        [
            SIGN,
            sign_job.signer_args(module, image, resolved, "any"),
            sign_job.signer_volumes(module, resolved),
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_job(
    module: Module,
    image: str,
    resolved: ResolvedMapping,
    attempt: int,
    candidates: Sequence[str],
    settings: BuildSettings,
    inputs: str,
    retry: int = 0,
) -> dict[str, Any]:
    """A build Job that runs kmodkit-build to build and push ``image``, made from ``inputs``."""
    args, mounts, volumes = _builder(module, image, resolved, settings)
    container = {
        "name": "build",
        "image": builder_image(settings.builder_image, resolved.build),
        "args": args,
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
        # Root in the container (buildah's storage and chroot need it), with the
        # capabilities of BUILDER_CAPABILITIES and nothing more; not privileged.
        # The container runtime's AppArmor profile denies mount(2) whatever the
        # capabilities, so it is off for this container; seccomp stays the
        # runtime's default, which allows mount and unshare to SYS_ADMIN holders.
        "securityContext": {
            "runAsUser": 0,
            "capabilities": {"drop": ["ALL"], "add": list(BUILDER_CAPABILITIES)},
            "seccompProfile": {"type": "RuntimeDefault"},
            "appArmorProfile": {"type": "Unconfined"},
        },
    }
    # matchFields takes one value per term; terms are ORed.
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    for node in candidates
                ]
            }
        }
    }
    pod = {"affinity": affinity, "containers": [container], "volumes": volumes}
    return _image_job(module, image, resolved, BUILD, attempt, settings, inputs, retry, pod)


def sign_job_for(
    module: Module,
    image: str,
    resolved: ResolvedMapping,
    attempt: int,
    arch: str,
    settings: BuildSettings,
    inputs: str,
    retry: int = 0,
) -> dict[str, Any]:
    """A Job that signs the unsigned image's files and pushes the result as ``image``.

    It needs nothing of a node, so it runs wherever the scheduler puts it on the
    image's architecture, as the signer's unprivileged user.
    """
    container = sign_job.signer_container(module, image, resolved, settings.signer_image, arch)
    volumes = sign_job.signer_volumes(module, resolved)
    if settings.registry_ca_config_map:
        # The registry the build pushed to, trusted the same way.
        container["volumeMounts"].append(dict(CA_MOUNT))
        container["args"].append(f"--registry-ca={CA_DIR}/ca.crt")
        volumes.append(_registry_ca_volume(settings))
    pod = {
        "nodeSelector": {"kubernetes.io/arch": arch},
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": sign_job.SIGNER_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    return _image_job(module, image, resolved, SIGN, attempt, settings, inputs, retry, pod)


def _image_job(
    module: Module,
    image: str,
    resolved: ResolvedMapping,
    step: str,
    attempt: int,
    settings: BuildSettings,
    inputs: str,
    retry: int,
    pod: Mapping[str, Any],
) -> dict[str, Any]:
    """The Job around ``pod``: what it pushes and was made from, recorded on it."""
    name, ns = module.metadata.name or "", module.metadata.namespace or ""
    pull: dict[str, Any] = {}
    if module.spec.image_repo_secret is not None:
        # The builder and signer images too, as loader pods pull the agent image with
        # it: an air-gapped fleet mirrors them beside its modules.
        pull["imagePullSecrets"] = [{"name": module.spec.image_repo_secret.name}]
    annotations = {
        IMAGE_ANNOTATION: image,
        ATTEMPT_ANNOTATION: str(attempt),
        INPUTS_ANNOTATION: inputs,
        RETRY_ANNOTATION: str(retry),
    }
    if step != BUILD:
        annotations[STEP_ANNOTATION] = step
    trigger = module.spec.image_rebuild_trigger_generation
    if trigger is not None:
        annotations[TRIGGER_ANNOTATION] = str(trigger)
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
            "name": job_name(name, image, attempt, step),
            "namespace": ns,
            "labels": meta_labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.deadline_seconds,
            "template": {
                "metadata": {"labels": meta_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "tolerations": module.spec.pod_tolerations(),
                    **pull,
                    **pod,
                },
            },
        },
    }
