"""Mapping resolution and merging, as KMM does it (and stricter where KMM is silent)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.api import Build, BuildArg, LocalObjectReference, Module, RegistryTLS
from kmodkit.core.engine.kernel_mapping import (
    NoMatch,
    ResolvedMapping,
    ResolveError,
    merge_builds,
    override_build_args,
    resolve,
)
from kmodkit.core.engine.module_rules import validate_module
from tests.unit.examples import image_from_the_container, kmm_example, minimal


def _module(body: dict[str, Any]) -> Module:
    return Module.model_validate(body)


def _resolved(body: dict[str, Any], kernel: str) -> ResolvedMapping:
    result = resolve(_module(body), kernel)
    assert isinstance(result, ResolvedMapping)
    return result


def _args(build: Build | None) -> list[tuple[str, str]]:
    assert build is not None
    return [(arg.name, arg.value) for arg in build.build_args or []]


def test_literal_match_uses_container_defaults() -> None:
    resolved = _resolved(kmm_example(), "6.8.0-45-generic")
    assert resolved.mapping_index == 0
    assert resolved.container_image == "registry.example.com:5000/drivers/xe:6.8.0-45-generic"
    assert resolved.registry_tls == RegistryTLS(insecure_skip_tls_verify=True)
    assert resolved.in_tree_modules_to_remove == ("xe", "i915")
    assert _args(resolved.build) == [
        ("XE_REF", "v1.4.0"),
        ("KVER_SHORT", "6.8.0"),
        ("KERNEL_FULL_VERSION", "6.8.0-45-generic"),
        ("KERNEL_VERSION", "6.8.0-45-generic"),
        ("MOD_NAME", "xe"),
        ("MOD_NAMESPACE", "drivers"),
    ]


def test_first_match_wins_and_mapping_settings_override() -> None:
    resolved = _resolved(kmm_example(), "6.12.0-55.el9_5.x86_64")
    assert resolved.mapping_index == 1
    assert resolved.container_image == "registry.example.com/drivers/xe-el9:6.12"
    assert resolved.registry_tls == RegistryTLS(insecure=True)
    assert resolved.in_tree_modules_to_remove == ("i915",)
    build = resolved.build
    assert build is not None
    assert build.dockerfile_config_map == LocalObjectReference(name="xe-dockerfile-el9")
    assert [s.name for s in build.secrets or []] == ["git-token", "rhsm"]
    # Base-image TLS and the build-node selector come from the container only.
    assert build.base_image_registry_tls == RegistryTLS(insecure=True)
    assert build.selector == {"node-role.kubernetes.io/builder": ""}
    assert _args(build) == [
        ("XE_REF", "v1.4.0-el9"),
        ("KVER_SHORT", "6.12.0"),
        ("DISTRO", "el9"),
        ("KERNEL_FULL_VERSION", "6.12.0-55.el9_5.x86_64"),
        ("KERNEL_VERSION", "6.12.0-55.el9_5.x86_64"),
        ("MOD_NAME", "xe"),
        ("MOD_NAMESPACE", "drivers"),
    ]


def test_regexp_is_unanchored_like_kmm() -> None:
    body = minimal(
        kernelMappings=[{"regexp": "5.14", "containerImage": "q.io/m:$KERNEL_FULL_VERSION"}]
    )
    assert _resolved(body, "15.14.1").container_image == "q.io/m:15.14.1"


def test_no_match() -> None:
    assert resolve(_module(kmm_example()), "5.14.0-284.el9.x86_64") == NoMatch(
        "5.14.0-284.el9.x86_64"
    )


def test_literal_is_exact_and_case_sensitive() -> None:
    body = minimal(kernelMappings=[{"literal": "6.8.0-Generic", "containerImage": "q.io/m:v"}])
    assert isinstance(resolve(_module(body), "6.8.0-generic"), NoMatch)
    assert isinstance(resolve(_module(body), "6.8.0-Generic"), ResolvedMapping)


def test_image_gets_normalised_kernel_and_build_args_the_raw_one() -> None:
    body = minimal(
        build={
            "dockerfileConfigMap": {"name": "df"},
            "buildArgs": [{"name": "KDIR", "value": "/lib/modules/${KERNEL_FULL_VERSION}"}],
        }
    )
    resolved = _resolved(body, "6.1.0+rpt-rpi-v8")
    assert resolved.container_image == "quay.io/org/mod:6.1.0_rpt-rpi-v8"
    assert ("KDIR", "/lib/modules/6.1.0+rpt-rpi-v8") in _args(resolved.build)


def test_injected_build_args_replace_user_ones_in_place() -> None:
    body = minimal(
        build={
            "dockerfileConfigMap": {"name": "df"},
            "buildArgs": [{"name": "MOD_NAME", "value": "mine"}, {"name": "X", "value": "1"}],
        }
    )
    assert _args(_resolved(body, "6.8.0").build) == [
        ("MOD_NAME", "mod"),
        ("X", "1"),
        ("KERNEL_FULL_VERSION", "6.8.0"),
        ("KERNEL_VERSION", "6.8.0"),
        ("MOD_NAMESPACE", "ns"),
    ]


def test_no_build_anywhere_means_none() -> None:
    assert _resolved(minimal(), "6.8.0").build is None


def test_mapping_only_build_is_used_whole() -> None:
    body = minimal()
    body["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["build"] = {
        "dockerfileConfigMap": {"name": "df"},
        "selector": {"a": "b"},
    }
    build = _resolved(body, "6.8.0").build
    assert build is not None
    assert build.selector == {"a": "b"}


def test_empty_mapping_list_replaces_container_in_tree_list() -> None:
    body = minimal(inTreeModulesToRemove=["i915"])
    body["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["inTreeModulesToRemove"] = []
    assert _resolved(body, "6.8.0").in_tree_modules_to_remove == ()


def test_override_build_args_appends_unmatched_sorted() -> None:
    base = [BuildArg(name="B", value="1"), BuildArg(name="A", value="1")]
    overrides = [BuildArg(name=n, value="2") for n in ("Z", "A", "C")]
    assert [(a.name, a.value) for a in override_build_args(base, overrides)] == [
        ("B", "1"),
        ("A", "2"),
        ("C", "2"),
        ("Z", "2"),
    ]


def test_merge_builds_with_neither_side() -> None:
    assert merge_builds(None, None) is None


@pytest.mark.parametrize(
    ("container", "mapping", "kernel", "path", "complaint"),
    [
        (
            {},
            {"regexp": "(6)\\1", "containerImage": "q.io/m:v"},
            "6.8.0",
            "spec.moduleLoader.container.kernelMappings[0].regexp",
            "backreference",
        ),
        (
            {},
            {"regexp": "^6", "containerImage": "q.io/m:$KERNEL_Z"},
            "6.8",
            "spec.moduleLoader.container.kernelMappings[0].containerImage",
            "fewer than three components",
        ),
        (
            {"containerImage": "q.io/m:${KERNEL_FULL}"},
            {"regexp": "^6", "containerImage": ""},
            "6.8.0",
            "spec.moduleLoader.container.containerImage",
            "unknown variable $KERNEL_FULL",
        ),
        (
            {
                "build": {
                    "dockerfileConfigMap": {"name": "d"},
                    "buildArgs": [
                        {"name": "A", "value": "x"},
                        {"name": "B", "value": "${MOD_NAME"},
                    ],
                }
            },
            {"regexp": "^6", "containerImage": "q.io/m:v"},
            "6.8.0",
            "spec.moduleLoader.container.build.buildArgs[1].value",
            "never closed",
        ),
        (
            {},
            {"regexp": "6", "containerImage": "q.io/m:$KERNEL_FULL_VERSION"},
            "-6.8.0",
            "spec.moduleLoader.container.kernelMappings[0].containerImage",
            "invalid tag",
        ),
        (
            {},
            {"regexp": "^6", "containerImage": ""},
            "6.8.0",
            "spec.moduleLoader.container.kernelMappings[0].containerImage",
            "is empty",
        ),
    ],
)
def test_errors_name_the_field(
    container: dict[str, Any], mapping: dict[str, Any], kernel: str, path: str, complaint: str
) -> None:
    body = minimal(kernelMappings=[mapping], **container)
    with pytest.raises(ResolveError) as err:
        resolve(_module(body), kernel)
    assert err.value.path == path
    assert complaint in err.value.message


def test_a_later_broken_regexp_does_not_matter_once_one_matched() -> None:
    body = minimal(
        kernelMappings=[
            {"literal": "6.8.0", "containerImage": "q.io/m:v"},
            {"regexp": "(?=x)", "containerImage": "q.io/m:v"},
        ]
    )
    assert _resolved(body, "6.8.0").mapping_index == 0


@settings(max_examples=300)
@given(
    kernel=st.text(max_size=40),
    literal=st.text(max_size=10),
    regexp=st.text(max_size=12),
    image=st.lists(
        st.sampled_from(["$", "{", "}", ":", "q.io/m", "KERNEL_X", "MOD_NAME", "-", "@", "a"]),
        max_size=10,
    ).map("".join),
    arg=st.text(max_size=20),
)
def test_resolve_never_crashes(
    kernel: str, literal: str, regexp: str, image: str, arg: str
) -> None:
    body = minimal(
        build={"dockerfileConfigMap": {"name": "d"}, "buildArgs": [{"name": "A", "value": arg}]},
        kernelMappings=[
            {"literal": literal, "containerImage": image},
            {"regexp": regexp, "containerImage": image},
        ],
    )
    try:
        result = resolve(_module(body), kernel)
    except ResolveError as err:
        assert err.path.startswith("spec.moduleLoader.container.")
        assert err.message
        return
    if isinstance(result, ResolvedMapping):
        assert "$" not in result.container_image


def test_a_mapping_without_an_image_takes_the_containers_as_kmm_does() -> None:
    body = image_from_the_container()
    assert validate_module(body) == []
    resolved = _resolved(body, "6.8.0-45-generic")
    assert resolved.container_image == "quay.io/org/mod:6.8.0-45-generic"


def test_the_deprecated_single_in_tree_module_replaces_the_lists_as_in_kmm() -> None:
    body = minimal(inTreeModulesToRemove=["i915", "intel_vsec"], inTreeModuleToRemove="xe")
    body["spec"]["moduleLoader"]["container"].pop("inTreeModulesToRemove")
    assert _resolved(body, "6.8.0").in_tree_modules_to_remove == ("xe",)
    body["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["inTreeModuleToRemove"] = "i915"
    assert _resolved(body, "6.8.0").in_tree_modules_to_remove == ("i915",)
    listed = minimal(inTreeModulesToRemove=["i915"])
    listed["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["inTreeModuleToRemove"] = "xe"
    assert _resolved(listed, "6.8.0").in_tree_modules_to_remove == ("xe",)
