"""In-cluster build plans: one build per missing image, retries with back-off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kmodkit.core.api import Build, Module
from kmodkit.core.engine import build_plan
from kmodkit.core.engine.build_plan import (
    BUILDER_CAPABILITIES,
    REPORTED_ANNOTATION,
    BuildEvent,
    BuildJob,
    BuildPlan,
    BuildSettings,
    backoff,
    build_inputs,
    build_job_view,
    builder_image,
    job_name,
    plan_builds,
)
from kmodkit.core.engine.loader_plan import ImageState, plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.nodes import NodeView

K1, K2 = "6.8.0-45-generic", "7.0.0-14-generic"
IMG1, IMG2 = f"r.io/xe:{K1}", f"r.io/xe:{K2}"
SETTINGS = BuildSettings(builder_image="ghcr.io/kmodkit/builder:0.1.0")
LOADER = LoaderSettings(agent_image="r.io/agent:1")


def module(
    build_selector: dict[str, str] | None = None, trigger: int | None = None, **build_fields: Any
) -> Module:
    build: dict[str, Any] = {
        "dockerfileConfigMap": {"name": "df"},
        "buildArgs": [{"name": "REF", "value": "v1"}],
        **build_fields,
    }
    if build_selector:
        build["selector"] = build_selector
    body: dict[str, Any] = {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": "xe", "namespace": "drivers"},
        "spec": {
            "selector": {},
            "imageRepoSecret": {"name": "push"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "registryTLS": {"insecureSkipTLSVerify": True},
                    "kernelMappings": [
                        {
                            "regexp": ".*",
                            "containerImage": "r.io/xe:${KERNEL_FULL_VERSION}",
                            "build": build,
                        }
                    ],
                }
            },
        },
    }
    if trigger is not None:
        body["spec"]["imageRebuildTriggerGeneration"] = trigger
    return Module.model_validate(body)


NODES = [
    NodeView(f"n{i}", {"pool": "gpu" if i < 4 else "build"}, K1 if i % 2 else K2, "amd64", True)
    for i in range(6)
]


DOCKERFILE = "FROM scratch\n"


def builds(
    m: Module,
    existence: dict[str, Answer],
    jobs: list[BuildJob],
    now: float = 1000.0,
    nodes: list[NodeView] = NODES,
    dockerfiles: dict[str, str] | None = None,
    settings: BuildSettings = SETTINGS,
) -> BuildPlan:
    first = plan(m, nodes, [], {}, LOADER)
    texts = {"df": DOCKERFILE} if dockerfiles is None else dockerfiles
    return plan_builds(
        m,
        first.needed_images,
        first.nodes_by_image,
        nodes,
        existence,
        jobs,
        texts.get,
        settings,
        now,
    )


MISSING = Answer(Existence.MISSING)


def test_one_build_per_missing_image_never_per_node() -> None:
    out = builds(module(), {IMG1: Answer(Existence.EXISTS), IMG2: MISSING}, [])
    assert len(out.create) == 1
    job = out.create[0]
    assert job["metadata"]["name"] == job_name("xe", IMG2, 1)
    assert out.states[IMG1].state is ImageState.EXISTS
    assert out.states[IMG2].state is ImageState.BUILDING
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == SETTINGS.builder_image
    args = container["args"]
    assert args[:3] == [
        f"--destination={IMG2}",
        "--dockerfile=/workspace/Dockerfile",
        "--context=/workspace",
    ]
    assert "--skip-tls-verify" in args
    # User args first, then the injected ones.
    build_args = [a for a in args if a.startswith("--build-arg=")]
    assert build_args[0] == "--build-arg=REF=v1"
    assert f"--build-arg=KERNEL_FULL_VERSION={K2}" in build_args
    # Pinned to nodes running the image's kernel, so headers match.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    names = {t["matchFields"][0]["values"][0] for t in terms}
    assert names == {n.name for n in NODES if n.kernel == K2}
    # The Module's pull secret logs the builder in, for the base images and the push.
    assert {
        "name": "registry-auth",
        "secret": {
            "secretName": "push",
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
        },
    } in pod["volumes"]
    assert {
        "name": "registry-auth",
        "mountPath": "/run/kmodkit/registry-auth",
        "readOnly": True,
    } in container["volumeMounts"]
    assert "--authfile=/run/kmodkit/registry-auth/config.json" in args
    # The Dockerfile from its ConfigMap; the host's modules visible to RUN steps, as under
    # kaniko; buildah's storage on the node's disk.
    assert {"name": "dockerfile", "mountPath": "/workspace", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert "--run-volume=/host/lib/modules:/host/lib/modules" in args
    assert {"name": "build-storage", "emptyDir": {}} in pod["volumes"]
    assert {"name": "build-storage", "mountPath": "/var/lib/containers"} in container[
        "volumeMounts"
    ]


def test_build_secrets_are_mounted_where_kmm_puts_them_and_bound_into_run_steps() -> None:
    (job,) = builds(module(secrets=[{"name": "token"}]), BOTH_MISSING, []).create
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "secret-0", "secret": {"secretName": "token"}} in pod["volumes"]
    assert {"name": "secret-0", "mountPath": "/run/secrets/token", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert "--run-volume=/run/secrets/token:/run/secrets/token" in container["args"]


def assert_mounts_the_registry_ca(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """The ConfigMap ``registry-ca`` (key ``bundle``), optional, mounted read-only."""
    assert {
        "name": "registry-ca",
        "configMap": {
            "name": "registry-ca",
            "items": [{"key": "bundle", "path": "ca.crt"}],
            "optional": True,
        },
    } in pod["volumes"]
    assert {
        "name": "registry-ca",
        "mountPath": "/etc/kmodkit/registry-ca",
        "readOnly": True,
    } in container["volumeMounts"]


def test_the_registry_ca_setting_is_the_builders_cert_dir() -> None:
    settings = replace(SETTINGS, registry_ca_config_map="registry-ca", registry_ca_key="bundle")
    (job,) = builds(module(), {IMG1: MISSING}, [], settings=settings).create
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--cert-dir=/etc/kmodkit/registry-ca" in container["args"]
    assert_mounts_the_registry_ca(pod, container)
    # Without the setting, the system's CAs only.
    (plain,) = builds(module(), {IMG1: MISSING}, []).create
    assert not any(
        a.startswith("--cert-dir")
        for a in plain["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_the_build_pod_pulls_the_builder_with_the_modules_pull_secret() -> None:
    (job,) = builds(module(), {IMG1: MISSING}, []).create
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "push"}]
    m = module().model_copy(deep=True)
    m.spec.image_repo_secret = None
    (plain,) = builds(m, {IMG1: MISSING}, []).create
    assert "imagePullSecrets" not in plain["spec"]["template"]["spec"]


def test_the_builder_runs_as_root_with_named_capabilities_not_privileged() -> None:
    (job,) = builds(module(), BOTH_MISSING, []).create
    (container,) = job["spec"]["template"]["spec"]["containers"]
    context = container["securityContext"]
    assert "privileged" not in context
    assert context["runAsUser"] == 0
    assert context["capabilities"] == {"drop": ["ALL"], "add": list(BUILDER_CAPABILITIES)}
    # SYS_ADMIN for the RUN steps' mount namespaces; nothing that reaches the host's devices,
    # modules or network configuration.
    assert "SYS_ADMIN" in BUILDER_CAPABILITIES
    assert not {"SYS_MODULE", "NET_ADMIN", "MKNOD", "SYS_PTRACE"} & set(BUILDER_CAPABILITIES)
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_build_selector_picks_build_nodes_of_the_same_kernel() -> None:
    out = builds(module({"pool": "build"}), {IMG2: MISSING, IMG1: Answer(Existence.EXISTS)}, [])
    terms = out.create[0]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchFields"][0]["values"][0] for t in terms] == ["n4"]


def test_an_unreachable_registry_never_triggers_a_build() -> None:
    out = builds(
        module(),
        {
            IMG1: Answer(Existence.UNKNOWN, "cannot reach"),
            IMG2: Answer(Existence.UNKNOWN, "cannot reach"),
        },
        [],
    )
    assert not out.create
    assert out.states[IMG1].state is ImageState.UNKNOWN


def test_active_build_is_not_duplicated() -> None:
    job = BuildJob(job_name("xe", IMG2, 1), IMG2, 1, active=True)
    out = builds(module(), {IMG1: Answer(Existence.EXISTS), IMG2: MISSING}, [job])
    assert not out.create and not out.delete
    assert out.states[IMG2].state is ImageState.BUILDING


def test_failed_build_is_retried_after_backoff_as_a_new_attempt() -> None:
    failed = BuildJob(
        job_name("xe", IMG2, 1),
        IMG2,
        1,
        failed=True,
        finished_at=1000.0,
        message="BackoffLimitExceeded",
    )
    existence = {IMG1: Answer(Existence.EXISTS), IMG2: MISSING}
    early = builds(module(), existence, [failed], now=1010.0)
    assert not early.create
    assert early.states[IMG2].state is ImageState.BUILD_FAILED
    assert "attempt 1" in early.states[IMG2].detail and "retrying in" in early.states[IMG2].detail
    assert early.requeue_after == backoff(1, SETTINGS) - 10
    due = builds(module(), existence, [failed], now=1000.0 + backoff(1, SETTINGS))
    assert [j["metadata"]["name"] for j in due.create] == [job_name("xe", IMG2, 2)]
    # Once attempt 2 exists, attempt 1 is cleaned up.
    second = BuildJob(job_name("xe", IMG2, 2), IMG2, 2, active=True)
    later = builds(module(), existence, [failed, second], now=2000.0)
    assert later.delete == [failed.name] and not later.create


def test_success_without_the_image_in_the_registry_is_a_failure_after_grace() -> None:
    done = BuildJob(job_name("xe", IMG2, 1), IMG2, 1, succeeded=True, finished_at=1000.0)
    existence = {IMG1: Answer(Existence.EXISTS), IMG2: MISSING}
    assert builds(module(), existence, [done], now=1010.0).states[IMG2].state is ImageState.BUILDING
    late = builds(module(), existence, [done], now=1070.0)
    assert late.states[IMG2].state is ImageState.BUILD_FAILED
    assert "not in the registry" in late.states[IMG2].detail


def test_builds_of_images_no_longer_needed_are_removed() -> None:
    stray = BuildJob("xe-build-old-1", "r.io/xe:old", 1, active=True)
    out = builds(
        module(), {IMG1: Answer(Existence.EXISTS), IMG2: Answer(Existence.EXISTS)}, [stray]
    )
    assert out.delete == ["xe-build-old-1"]


# -- what a Job was made from, and the rebuild trigger ---------------------------

BOTH_MISSING = {IMG1: Answer(Existence.EXISTS), IMG2: MISSING}
T0 = 1000.0


def observed(
    job: dict[str, Any],
    active: int = 0,
    done: str = "",
    message: str = "",
    reported: str | None = None,
) -> BuildJob:
    """A Job the plan made, as the watch later shows it: ``done`` is Complete or Failed, at T0."""
    status: dict[str, Any] = {"active": active}
    if done:
        status["succeeded" if done == "Complete" else "failed"] = 1
        status["conditions"] = [
            {
                "type": done,
                "status": "True",
                "lastTransitionTime": "1970-01-01T00:16:40Z",  # T0
                "message": message,
            }
        ]
    meta = dict(job["metadata"])
    if reported is not None:
        meta["annotations"] = {**meta["annotations"], REPORTED_ANNOTATION: reported}
    return build_job_view({**job, "metadata": meta, "status": status})


def first_job(m: Module, dockerfile: str = DOCKERFILE) -> dict[str, Any]:
    (job,) = builds(m, BOTH_MISSING, [], dockerfiles={"df": dockerfile}).create
    return job


def test_a_bumped_rebuild_trigger_retries_a_failed_build_at_once_and_restarts_back_off() -> None:
    failed = observed(first_job(module()), done="Failed", message="BackoffLimitExceeded")
    assert failed.failed and failed.finished_at == T0 and failed.trigger is None
    # Within the back-off, the same trigger waits...
    assert not builds(module(), BOTH_MISSING, [failed], now=T0 + 5).create
    # ...a bumped one builds now, as the next attempt.
    out = builds(module(trigger=1), BOTH_MISSING, [failed], now=T0 + 5)
    (job,) = out.create
    assert job["metadata"]["name"] == job_name("xe", IMG2, 2)
    assert out.states[IMG2].state is ImageState.BUILDING
    (created,) = [e for e in out.events if e.reason == "BuildCreated"]
    assert "imageRebuildTriggerGeneration" in created.message
    # That attempt failing too waits the first back-off step again, not the second.
    second = observed(job, done="Failed")
    assert second.trigger == 1 and second.retry == 0
    wait = builds(module(trigger=1), BOTH_MISSING, [failed, second], now=T0 + 5)
    assert not wait.create and wait.requeue_after == backoff(1, SETTINGS) - 5
    due = builds(module(trigger=1), BOTH_MISSING, [failed, second], now=T0 + backoff(1, SETTINGS))
    assert [j["metadata"]["name"] for j in due.create] == [job_name("xe", IMG2, 3)]


def test_retries_of_the_same_inputs_back_off_further_across_restarts() -> None:
    failed = observed(first_job(module()), done="Failed")
    (retry,) = builds(module(), BOTH_MISSING, [failed], now=T0 + backoff(1, SETTINGS)).create
    again = observed(retry, done="Failed")
    assert again.retry == 1  # read back from the Job, not remembered
    assert not builds(module(), BOTH_MISSING, [again], now=T0 + backoff(1, SETTINGS)).create
    assert builds(module(), BOTH_MISSING, [again], now=T0 + backoff(2, SETTINGS)).create


def test_a_job_from_before_inputs_were_recorded_keeps_its_back_off() -> None:
    old = build_job_view(
        {
            "metadata": {
                "name": job_name("xe", IMG2, 3),
                "annotations": {"kmodkit.io/image": IMG2, "kmodkit.io/build-attempt": "3"},
            },
            "status": {"active": 1},
        }
    )
    assert old.inputs is None and old.retry == 2
    # Unknown inputs are never taken for changed ones: its running build stays.
    out = builds(module(), BOTH_MISSING, [old], dockerfiles={"df": "FROM other\n"})
    assert not out.create and not out.delete


# -- a running build whose inputs change -----------------------------------------


def restarted(job: BuildJob, m: Module, dockerfile: str = DOCKERFILE, **kw: Any) -> BuildPlan:
    return builds(m, BOTH_MISSING, [job], dockerfiles={"df": dockerfile, "df2": dockerfile}, **kw)


def test_a_changed_dockerfile_or_build_setting_replaces_the_running_build() -> None:
    running = observed(first_job(module()), active=1)
    changes = {
        "Dockerfile text": restarted(running, module(), "FROM busybox\n"),
        "ConfigMap": restarted(running, module(dockerfileConfigMap={"name": "df2"})),
        "build args": restarted(running, module(buildArgs=[{"name": "REF", "value": "v2"}])),
        "secrets": restarted(running, module(secrets=[{"name": "token"}])),
        "base image TLS": restarted(running, module(baseImageRegistryTLS={"insecure": True})),
    }
    for change, out in changes.items():
        assert out.delete == [running.name], change
        assert [j["metadata"]["name"] for j in out.create] == [job_name("xe", IMG2, 2)], change
        (created,) = [e for e in out.events if e.reason == "BuildCreated"]
        assert f"replaces {running.name}" in created.message, change


def test_a_running_build_stays_while_what_it_builds_from_is_the_same() -> None:
    running = observed(first_job(module()), active=1)
    other_nodes = [*NODES, NodeView("n9", {}, K2, "amd64", True)]
    same = {
        "nothing changed": restarted(running, module()),
        # The builder image and the nodes it may run on do not change the image.
        "builder image": restarted(running, module(), settings=BuildSettings("kaniko:v2")),
        "candidate nodes": restarted(running, module(), nodes=other_nodes),
        # Nor does a bumped trigger: the build under way already builds afresh.
        "trigger": restarted(running, module(trigger=5)),
        # A ConfigMap that cannot be read now says nothing about what changed.
        "ConfigMap gone": builds(module(), BOTH_MISSING, [running], dockerfiles={}),
    }
    for case, out in same.items():
        assert not out.delete and not out.create, case
        assert out.states[IMG2].state is ImageState.BUILDING, case
    # Nothing watches ConfigMaps: the running build's Dockerfile is read again soon.
    assert same["nothing changed"].requeue_after == SETTINGS.input_recheck_seconds


def test_a_failed_build_is_retried_at_once_when_its_dockerfile_is_fixed() -> None:
    failed = observed(first_job(module()), done="Failed")
    out = builds(module(), BOTH_MISSING, [failed], now=T0 + 5, dockerfiles={"df": "FROM fixed\n"})
    (job,) = out.create
    assert job["metadata"]["annotations"]["kmodkit.io/build-retry"] == "0"


def test_a_missing_dockerfile_is_reported_not_built() -> None:
    out = builds(module(), BOTH_MISSING, [], dockerfiles={})
    assert not out.create
    assert out.states[IMG2].state is ImageState.BUILD_FAILED
    assert "ConfigMap drivers/df has no key 'dockerfile'" in out.states[IMG2].detail
    assert out.requeue_after == SETTINGS.input_recheck_seconds


# -- build events ------------------------------------------------------------------


def reasons(out: BuildPlan) -> list[str]:
    return [e.reason for e in out.events]


def test_build_events_are_posted_once_per_job_as_its_annotation_records() -> None:
    job = first_job(module())
    pending = observed(job)
    out = builds(module(), BOTH_MISSING, [pending])
    assert reasons(out) == [] and out.reported == {}
    running = observed(job, active=1)
    out = builds(module(), BOTH_MISSING, [running])
    assert reasons(out) == ["BuildStarted"]
    assert out.reported == {running.name: "started"}
    # The next pass reads what was recorded on the Job and says nothing again.
    told = observed(job, active=1, reported=out.reported[running.name])
    assert builds(module(), BOTH_MISSING, [told]).events == []
    done = observed(job, done="Complete", reported="started")
    out = builds(module(), {IMG1: Answer(Existence.EXISTS), IMG2: Answer(Existence.EXISTS)}, [done])
    assert reasons(out) == ["BuildSucceeded"] and out.reported == {done.name: "started,succeeded"}


def test_a_build_seen_only_once_finished_is_still_reported_started() -> None:
    failed = observed(first_job(module()), done="Failed", message="kaniko exited with 1")
    out = builds(module(), BOTH_MISSING, [failed], now=T0 + 5)
    assert reasons(out) == ["BuildStarted", "BuildFailed"]
    warning = out.events[1]
    assert warning.warning and "kaniko exited with 1" in warning.message
    assert failed.name in warning.message
    assert out.reported == {failed.name: "started,failed"}
    # The retry's creation is told after the failure it follows.
    retry = builds(module(), BOTH_MISSING, [failed], now=T0 + backoff(1, SETTINGS))
    assert reasons(retry) == ["BuildStarted", "BuildFailed", "BuildCreated"]


def test_success_without_the_image_is_reported_as_a_failed_build_after_grace() -> None:
    done = observed(first_job(module()), done="Complete", reported="started,succeeded")
    assert builds(module(), BOTH_MISSING, [done], now=T0 + 10).events == []
    late = builds(module(), BOTH_MISSING, [done], now=T0 + 70)
    assert late.events == [
        BuildEvent(
            "BuildFailed",
            f"Job {done.name} (attempt 1) for {IMG2} failed: it succeeded but {IMG2} was not "
            "in the registry 60s later",
            warning=True,
            job=done.name,
        )
    ]


def test_jobs_going_away_and_jobs_from_before_events_are_not_reported() -> None:
    running = observed(first_job(module()), active=1)
    replaced = restarted(running, module(), "FROM busybox\n")
    assert reasons(replaced) == ["BuildCreated"]
    stray = BuildJob("xe-build-old-1", "r.io/xe:old", 1, succeeded=True, started=True)
    both_exist = {IMG1: Answer(Existence.EXISTS), IMG2: Answer(Existence.EXISTS)}
    assert builds(module(), both_exist, [stray]).events == []
    legacy = build_job_view(
        {
            "metadata": {
                "name": job_name("xe", IMG2, 1),
                "annotations": {"kmodkit.io/image": IMG2, "kmodkit.io/build-attempt": "1"},
            },
            "status": {"active": 1},
        }
    )
    assert builds(module(), BOTH_MISSING, [legacy]).events == []


def test_a_running_build_is_kept_when_no_node_could_run_its_successor() -> None:
    running = observed(first_job(module()), active=1)
    # The nodes of its kernel still need the image but are not ready to build it.
    unready = [replace(n, ready=False) if n.kernel == K2 else n for n in NODES]
    out = restarted(running, module(), "FROM busybox\n", nodes=unready)
    assert IMG2 in out.states and not out.create
    assert not out.delete


def test_kaniko_params_tag_replaces_the_builder_images_tag_and_keeps_a_registry_port() -> None:
    build = Build.model_validate(
        {"dockerfileConfigMap": {"name": "df"}, "kanikoParams": {"tag": "0.2.0-debug"}}
    )
    assert builder_image("registry:5000/kmodkit/builder:0.1.0", build) == (
        "registry:5000/kmodkit/builder:0.2.0-debug"
    )
    assert builder_image("registry:5000/builder@sha256:" + "a" * 64, build) == (
        "registry:5000/builder:0.2.0-debug"
    )
    assert builder_image("ghcr.io/kmodkit/builder", build) == "ghcr.io/kmodkit/builder:0.2.0-debug"
    plain = Build.model_validate({"dockerfileConfigMap": {"name": "df"}})
    assert builder_image("ghcr.io/kmodkit/builder:0.1.0", plain) == "ghcr.io/kmodkit/builder:0.1.0"


def test_the_inputs_digest_is_of_what_the_build_reads_not_of_the_builders_flags(
    monkeypatch: Any,
) -> None:
    """A new builder, or new spellings of its flags, rebuilds nothing and replaces no running
    build; what the flags mean still counts."""

    def digest(m: Module) -> str:
        mapping = plan(m, NODES, [], {}, LOADER).needed_images[IMG2]
        return build_inputs(m, IMG2, mapping, DOCKERFILE)

    before = digest(module())
    monkeypatch.setattr(build_plan, "tls_flags", lambda tls, push: ["--tls-verify=false"])
    monkeypatch.setattr(build_plan, "HOST_MODULES", "/elsewhere/lib/modules")
    assert digest(module()) == before
    monkeypatch.undo()
    # An explicit false does what an absent field does.
    assert digest(module(baseImageRegistryTLS={"insecure": False})) == before
    assert digest(module(baseImageRegistryTLS={"insecureSkipTLSVerify": True})) != before
