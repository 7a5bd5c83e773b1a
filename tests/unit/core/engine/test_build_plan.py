"""In-cluster build plans: one build per missing image, retries with back-off."""

from __future__ import annotations

from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.build_plan import BuildJob, BuildSettings, backoff, job_name, plan_builds
from kmodkit.core.engine.loader_plan import ImageState, plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.nodes import NodeView

K1, K2 = "6.8.0-45-generic", "7.0.0-14-generic"
IMG1, IMG2 = f"r.io/xe:{K1}", f"r.io/xe:{K2}"
SETTINGS = BuildSettings(builder_image="gcr.io/kaniko-project/executor:v1.23.2")
LOADER = LoaderSettings(agent_image="r.io/agent:1")


def module(build_selector: dict[str, str] | None = None) -> Module:
    build: dict[str, Any] = {
        "dockerfileConfigMap": {"name": "df"},
        "buildArgs": [{"name": "REF", "value": "v1"}],
    }
    if build_selector:
        build["selector"] = build_selector
    return Module.model_validate(
        {
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
    )


NODES = [
    NodeView(f"n{i}", {"pool": "gpu" if i < 4 else "build"}, K1 if i % 2 else K2, "amd64", True)
    for i in range(6)
]


def builds(
    m: Module,
    existence: dict[str, Answer],
    jobs: list[BuildJob],
    now: float = 1000.0,
    nodes: list[NodeView] = NODES,
) -> Any:
    first = plan(m, nodes, [], {}, LOADER)
    return plan_builds(
        m, first.needed_images, first.nodes_by_image, nodes, existence, jobs, SETTINGS, now
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
    args = pod["containers"][0]["args"]
    assert f"--destination={IMG2}" in args and "--skip-tls-verify" in args
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
    assert {
        "name": "push-auth",
        "secret": {
            "secretName": "push",
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
        },
    } in pod["volumes"]


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
