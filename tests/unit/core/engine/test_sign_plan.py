"""Signed images: the merged sign section, and the build-then-sign Jobs that make them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kmodkit.core.api import Module
from kmodkit.core.engine.build_plan import (
    STEP_ANNOTATION,
    BuildJob,
    BuildPlan,
    BuildSettings,
    build_job_view,
    job_name,
    plan_builds,
    unsigned_images,
)
from kmodkit.core.engine.kernel_mapping import ResolvedMapping, ResolveError, resolve
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus, plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.nodes import NodeView
from tests.unit.core.engine.test_build_plan import assert_mounts_the_registry_ca

K = "6.8.0-45-generic"
IMAGE = f"r.io/xe:{K}"
UNSIGNED = f"r.io/xe-unsigned:{K}"
BUILT_UNSIGNED = f"r.io/xe:{K}-unsigned"
SETTINGS = BuildSettings(builder_image="r.io/builder:1", signer_image="r.io/signer:1")
LOADER = LoaderSettings(agent_image="r.io/agent:1")
NODES = [NodeView(f"n{i}", {}, K, "arm64", True) for i in range(3)]
EXISTS, MISSING = Answer(Existence.EXISTS), Answer(Existence.MISSING)
FILE = "/opt/lib/modules/${KERNEL_FULL_VERSION}/extra/xe.ko"


def sign(**fields: Any) -> dict[str, Any]:
    section = {
        "keySecret": {"name": "key"},
        "certSecret": {"name": "cert"},
        "filesToSign": [FILE],
        **fields,
    }
    return {k: v for k, v in section.items() if v is not None}


def module(build: bool = False, container: dict[str, Any] | None = None, **mapping: Any) -> Module:
    kernel_mapping: dict[str, Any] = {
        "regexp": ".*",
        "containerImage": "r.io/xe:${KERNEL_FULL_VERSION}",
        **mapping,
    }
    if build:
        kernel_mapping["build"] = {"dockerfileConfigMap": {"name": "df"}}
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
                        "kernelMappings": [kernel_mapping],
                        **(container or {}),
                    }
                },
            },
        }
    )


def resolved(m: Module) -> ResolvedMapping:
    found = resolve(m, K)
    assert isinstance(found, ResolvedMapping)
    return found


def builds(
    m: Module,
    existence: dict[str, Answer],
    jobs: list[BuildJob] = [],  # noqa: B006
    settings: BuildSettings = SETTINGS,
) -> BuildPlan:
    first = plan(m, NODES, [], {}, LOADER)
    return plan_builds(
        m,
        first.needed_images,
        first.nodes_by_image,
        NODES,
        existence,
        jobs,
        {"df": "FROM scratch\n"}.get,
        settings,
        1000.0,
    )


# -- the merged sign section ----------------------------------------------------------


def test_a_mapping_sign_is_merged_over_the_containers_as_kmm_merges_them() -> None:
    m = module(
        container={"sign": sign(unsignedImage="r.io/base:${KERNEL_FULL_VERSION}")},
        sign=sign(
            keySecret={"name": "mapping-key"},
            filesToSign=["/opt/lib/modules/${KERNEL_FULL_VERSION}/extra/dep.ko"],
        ),
    )
    s = resolved(m).sign
    assert s is not None
    assert s.unsigned_image == f"r.io/base:{K}"  # the container's, the mapping has none
    assert (s.key_secret, s.cert_secret) == ("mapping-key", "cert")
    assert s.files_to_sign == (
        f"/opt/lib/modules/{K}/extra/xe.ko",
        f"/opt/lib/modules/{K}/extra/dep.ko",
    )


def test_with_a_build_the_unsigned_image_is_containerimage_tagged_unsigned() -> None:
    r = resolved(module(build=True, sign=sign()))
    assert r.sign is not None and r.sign.unsigned_image == BUILT_UNSIGNED
    assert r.build_target == BUILT_UNSIGNED
    # A named unsigned image is where the build pushes instead.
    named = resolved(module(build=True, sign=sign(unsignedImage="r.io/u:v1")))
    assert named.build_target == "r.io/u:v1"


@pytest.mark.parametrize(
    ("m", "path", "words"),
    [
        (module(sign=sign()), "kernelMappings[0].sign", "needs something to sign"),
        (
            module(
                containerImage="r.io/xe@sha256:" + "a" * 64, sign=sign(unsignedImage="r.io/u:1")
            ),
            "kernelMappings[0].containerImage",
            "cannot pin a digest",
        ),
        (
            module(sign=sign(unsignedImage="r.io/u:1", filesToSign=["/lib/xe.ko"])),
            "kernelMappings[0].sign.filesToSign[0]",
            "dirName",
        ),
        (
            module(build=True, containerImage="r.io/xe:" + "t" * 120, sign=sign()),
            "kernelMappings[0].sign.unsignedImage",
            "too long",
        ),
    ],
)
def test_a_sign_that_cannot_be_resolved_names_its_field(m: Module, path: str, words: str) -> None:
    with pytest.raises(ResolveError) as err:
        resolve(m, K)
    assert err.value.path.endswith(path) and words in err.value.message


# -- the Jobs ---------------------------------------------------------------------------


def test_a_missing_signed_image_is_signed_from_its_unsigned_one() -> None:
    m = module(sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    out = builds(m, {IMAGE: MISSING, UNSIGNED: EXISTS})
    (job,) = out.create
    assert job["metadata"]["name"] == job_name("xe", IMAGE, 1, "sign")
    assert job["metadata"]["annotations"][STEP_ANNOTATION] == "sign"
    assert out.states[IMAGE].state is ImageState.SIGNING
    assert [e.reason for e in out.events] == ["SignCreated"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "r.io/signer:1"
    assert container["args"] == [
        "--unsigned-image", UNSIGNED, "--image", IMAGE,
        "--file", f"/opt/lib/modules/{K}/extra/xe.ko",
        "--key", "/run/secrets/key/key.pem", "--cert", "/run/secrets/cert/cert.pem",
        "--platform", "linux/arm64", "--docker-config", "/docker/config.json",
    ]  # fmt: skip
    # Unprivileged, no token, nothing of the node; the Secrets as files its user can read.
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not any("hostPath" in v for v in pod["volumes"])
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    secrets = {
        v["secret"]["secretName"]: v["secret"]["items"] for v in pod["volumes"] if "secret" in v
    }
    assert secrets == {
        "key": [{"key": "key", "path": "key.pem"}],
        "cert": [{"key": "cert", "path": "cert.pem"}],
        "push": [{"key": ".dockerconfigjson", "path": "config.json"}],
    }


def test_registry_tls_goes_to_the_push_and_unsigned_image_tls_to_the_pull() -> None:
    m = module(
        registryTLS={"insecure": True},
        sign=sign(
            unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}",
            unsignedImageRegistryTLS={"insecureSkipTLSVerify": True},
        ),
    )
    (job,) = builds(m, {IMAGE: MISSING, UNSIGNED: EXISTS}).create
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--insecure", "--skip-tls-verify-pull"]


def test_the_registry_ca_setting_is_trusted_by_the_signer_as_by_the_builder() -> None:
    m = module(sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    settings = replace(SETTINGS, registry_ca_config_map="registry-ca", registry_ca_key="bundle")
    (job,) = builds(m, {IMAGE: MISSING, UNSIGNED: EXISTS}, settings=settings).create
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--registry-ca=/etc/kmodkit/registry-ca/ca.crt" in container["args"]
    assert_mounts_the_registry_ca(pod, container)


def test_with_a_build_the_unsigned_image_is_built_first_and_never_under_the_final_name() -> None:
    m = module(build=True, sign=sign())
    out = builds(m, {IMAGE: MISSING, BUILT_UNSIGNED: MISSING})
    (job,) = out.create
    assert job["metadata"]["annotations"]["kmodkit.io/image"] == BUILT_UNSIGNED
    assert STEP_ANNOTATION not in job["metadata"]["annotations"]
    assert (
        f"--destination={BUILT_UNSIGNED}"
        in job["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert out.states[IMAGE].state is ImageState.BUILDING
    # Once the unsigned image is there, the sign Job follows; the build Job is kept.
    built = build_job_view(job | {"status": {"succeeded": 1}})
    after = builds(m, {IMAGE: MISSING, BUILT_UNSIGNED: EXISTS}, [built])
    assert [j["metadata"]["annotations"].get(STEP_ANNOTATION) for j in after.create] == ["sign"]
    assert after.delete == []


@pytest.mark.parametrize(
    ("unsigned", "state", "words"),
    [
        (MISSING, ImageState.MISSING, f"the unsigned image {UNSIGNED} does not exist"),
        (Answer(Existence.UNKNOWN, "registry down"), ImageState.UNKNOWN, "registry down"),
    ],
)
def test_without_a_build_an_unsigned_image_the_registry_lacks_stops_there(
    unsigned: Answer, state: ImageState, words: str
) -> None:
    m = module(sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    out = builds(m, {IMAGE: MISSING, UNSIGNED: unsigned})
    assert out.create == []
    assert out.states[IMAGE].state is state and words in out.states[IMAGE].detail


def test_a_signed_image_that_exists_needs_nothing_and_its_unsigned_one_is_not_asked_for() -> None:
    m = module(sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    first = plan(m, NODES, [], {}, LOADER)
    assert unsigned_images(first.needed_images, {IMAGE: EXISTS}) == {}
    assert list(unsigned_images(first.needed_images, {IMAGE: MISSING})) == [UNSIGNED]
    out = builds(m, {IMAGE: EXISTS})
    assert out.create == [] and out.states[IMAGE].state is ImageState.EXISTS


def test_a_failed_sign_job_is_reported_and_retried_after_its_back_off() -> None:
    m = module(sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    (job,) = builds(m, {IMAGE: MISSING, UNSIGNED: EXISTS}).create
    failed = replace(
        build_job_view(job), failed=True, finished_at=990.0, message="BackoffLimitExceeded"
    )
    out = builds(m, {IMAGE: MISSING, UNSIGNED: EXISTS}, [failed])
    assert out.create == []
    assert out.states[IMAGE].state is ImageState.SIGN_FAILED
    assert "BackoffLimitExceeded" in out.states[IMAGE].detail
    assert [e.reason for e in out.events] == ["SignFailed"]


def test_a_build_job_for_the_image_made_before_sign_was_added_gives_way_to_a_sign_job() -> None:
    before = module(build=True)
    (old,) = builds(before, {IMAGE: MISSING}).create
    # Made before Jobs recorded their inputs, too: its step alone tells it apart.
    running = replace(build_job_view(old), active=True, started=True, inputs=None)
    m = module(build=True, sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    out = builds(m, {IMAGE: MISSING, UNSIGNED: EXISTS}, [running])
    assert [j["metadata"]["annotations"].get(STEP_ANNOTATION) for j in out.create] == ["sign"]
    assert out.delete == [old["metadata"]["name"]]


@pytest.mark.parametrize(
    ("state", "reason"),
    [(ImageState.SIGNING, "Signing"), (ImageState.SIGN_FAILED, "SignFailed")],
)
def test_nodes_say_their_image_is_being_signed_or_failed_to_be(
    state: ImageState, reason: str
) -> None:
    m = module(sign=sign(unsignedImage="r.io/xe-unsigned:${KERNEL_FULL_VERSION}"))
    out = plan(m, NODES, [], {IMAGE: ImageStatus(state, "why")}, LOADER)
    assert {o.reason for o in out.outcomes} == {reason}
    assert out.create == []
