"""Invalid ClusterPolicies, each with the field it breaks and what each check says.

Shared by the offline checks (``kmodkit validate``, test_intel_validation.py) and
the real apiserver (tests/integration/test_cluster_policy_admission.py): the same
object must be refused by both, naming the same field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kmodkit.backends.intel_xe import api
from kmodkit.core.api.common import TOLERATION_EMPTY_KEY_MSG
from kmodkit.core.api.module import (
    SIGN_DIGEST_MSG,
    SIGN_DIR_MSG,
    SIGN_SOURCE_MSG,
    UNKNOWN_VARIABLE_MSG,
)

MAPPING = "spec.kernelModule.kernelMappings[0]"


@dataclass(frozen=True)
class Case:
    id: str
    spec: dict[str, Any]
    path: str
    """The field both refusals name."""
    offline: str
    """A part of kmodkit's own check's message."""
    admission: str | None
    """The CEL rule's message the apiserver answers with; None where only kmodkit checks."""


def kernel_module(**fields: Any) -> dict[str, Any]:
    return {
        "kernelMappings": [
            {
                "regexp": "^7[.]0[.]0-.*-generic$",
                "containerImage": "reg.local/xe:v1-$KERNEL_FULL_VERSION",
            }
        ],
        **fields,
    }


def _mapping(**fields: Any) -> dict[str, Any]:
    km = kernel_module()
    km["kernelMappings"][0].update(fields)
    return {"kernelModule": km}


def _build(**fields: Any) -> dict[str, Any]:
    return _mapping(build={"dockerfileConfigMap": {"name": "b"}, **fields})


SPEC_CASES = [
    Case(
        "allow-and-deny",
        {"dp": {"allowIDs": ["0xe20b"], "denyIDs": ["0xe20c"]}},
        "spec.dp",
        api.IDS_BOTH_MSG,
        api.IDS_BOTH_MSG,
    ),
    Case(
        "allow-id-uppercase",
        {"dp": {"allowIDs": ["0xE20B"]}},
        "spec.dp.allowIDs[0]",
        f"'0xE20B' {api.PCI_ID_MSG}",
        f"dp.allowIDs: {api.PCI_ID_MSG}",
    ),
    Case(
        "deny-id-no-prefix",
        {"dp": {"denyIDs": ["e20b"]}},
        "spec.dp.denyIDs[0]",
        f"'e20b' {api.PCI_ID_MSG}",
        f"dp.denyIDs: {api.PCI_ID_MSG}",
    ),
    Case(
        "pull-secret-name",
        {"pullSecret": {"name": "Bad_Name"}},
        "spec.pullSecret.name",
        api.OBJECT_NAME_MSG,
        f"pullSecret.name: {api.OBJECT_NAME_MSG}",
    ),
    Case(
        "config-map-override-name",
        {"xpu": {"configMapOverride": "UPPER"}},
        "spec.xpu.configMapOverride",
        api.OBJECT_NAME_MSG,
        f"xpu.configMapOverride: {api.OBJECT_NAME_MSG}",
    ),
    Case(
        "module-name",
        {"kernelModule": kernel_module(moduleName="xe.ko")},
        "spec.kernelModule.moduleName",
        api.MODULE_NAME_MSG,
        f"kernelModule.moduleName: {api.MODULE_NAME_MSG}",
    ),
    Case(
        "version-not-a-label-value",
        {"kernelModule": kernel_module(version="v1 beta")},
        "spec.kernelModule.version",
        api.VERSION_MSG,
        f"kernelModule.version: {api.VERSION_MSG}",
    ),
    Case(
        "firmware-path-relative",
        {"kernelModule": kernel_module(firmwarePath="firmware")},
        "spec.kernelModule.firmwarePath",
        api.FIRMWARE_PATH_MSG,
        f"kernelModule.firmwarePath: {api.FIRMWARE_PATH_MSG}",
    ),
    Case(
        "loading-order-of-one",
        {"kernelModule": kernel_module(modulesLoadingOrder=["xe"])},
        "spec.kernelModule.modulesLoadingOrder",
        api.ORDER_SIZE_MSG,
        f"kernelModule.modulesLoadingOrder: {api.ORDER_SIZE_MSG}",
    ),
    Case(
        "loading-order-first",
        {"kernelModule": kernel_module(modulesLoadingOrder=["drm_buddy", "xe"])},
        "spec.kernelModule.modulesLoadingOrder[0]",
        f"{api.ORDER_FIRST_MSG} ('xe'), not 'drm_buddy'",
        f"kernelModule.modulesLoadingOrder[0]: {api.ORDER_FIRST_MSG}",
    ),
    Case(
        "loading-order-duplicate",
        {"kernelModule": kernel_module(modulesLoadingOrder=["xe", "ttm", "ttm", "xe"])},
        "spec.kernelModule.modulesLoadingOrder[2]",
        f"{api.ORDER_DUPLICATE_MSG} ('ttm')",
        f"kernelModule.modulesLoadingOrder: {api.ORDER_DUPLICATE_MSG}",
    ),
    Case(
        "toleration-empty-key-equal",
        {"tolerations": [{"operator": "Equal", "value": "x"}]},
        "spec.tolerations[0].operator",
        "must be Exists when key is empty",
        f"operator: {TOLERATION_EMPTY_KEY_MSG}",
    ),
    *(
        Case(
            f"{field}-{image}-untagged",
            {field: {image: "registry:5000/intel/plugin"}},
            f"spec.{field}.{image}",
            "has no tag or digest",
            f"{field}.{image}: {api.IMAGE_MSG}",
        )
        for field, image in [
            ("dp", "plugin"),
            ("dp", "levelzero"),
            ("dra", "image"),
            ("xpu", "image"),
        ]
    ),
]


def _sign(**fields: Any) -> dict[str, Any]:
    return {
        "keySecret": {"name": "k"},
        "certSecret": {"name": "c"},
        "filesToSign": ["/opt/lib/modules/$KERNEL_FULL_VERSION/updates/xe.ko"],
        **fields,
    }


MAPPING_CASES = [
    Case(
        "sign-nothing-to-sign",
        _mapping(sign=_sign()),
        f"{MAPPING}.sign",
        SIGN_SOURCE_MSG,
        f"kernelModule.kernelMappings[].sign: {SIGN_SOURCE_MSG}",
    ),
    Case(
        "sign-image-pinned-by-digest",
        _mapping(
            containerImage="reg.local/xe@sha256:" + "a" * 64,
            sign=_sign(unsignedImage="reg.local/u:1"),
        ),
        f"{MAPPING}.containerImage",
        SIGN_DIGEST_MSG,
        f"kernelModule.kernelMappings[].containerImage: {SIGN_DIGEST_MSG}",
    ),
    Case(
        "sign-file-outside-opt",
        {
            "kernelModule": kernel_module(
                sign=_sign(unsignedImage="reg.local/xe-u:v1", filesToSign=["/lib/modules/xe.ko"])
            )
        },
        "spec.kernelModule.sign.filesToSign[0]",
        SIGN_DIR_MSG,
        f"kernelModule.sign.filesToSign: {SIGN_DIR_MSG}",
    ),
    Case(
        "regexp-empty",
        _mapping(regexp=""),
        f"{MAPPING}.regexp",
        api.REGEXP_REQUIRED_MSG,
        f"regexp: {api.REGEXP_REQUIRED_MSG}",
    ),
    Case("regexp-lookahead", _mapping(regexp="(?=7)"), f"{MAPPING}.regexp", "lookahead", None),
    Case(
        "image-empty",
        _mapping(containerImage=""),
        f"{MAPPING}.containerImage",
        api.MAPPING_IMAGE_REQUIRED_MSG,
        f"containerImage: {api.MAPPING_IMAGE_REQUIRED_MSG}",
    ),
    Case(
        "image-variable-in-the-repository",
        _mapping(containerImage="reg.local/xe-oot-kmd-${KERNEL_FULL_VERSION}"),
        f"{MAPPING}.containerImage",
        api.MAPPING_IMAGE_TAG_MSG,
        f"containerImage: {api.MAPPING_IMAGE_TAG_MSG}",
    ),
    Case(
        "image-untagged",
        _mapping(containerImage="registry:5000/xe"),
        f"{MAPPING}.containerImage",
        api.MAPPING_IMAGE_TAG_MSG,
        f"containerImage: {api.MAPPING_IMAGE_TAG_MSG}",
    ),
    Case(
        "image-unknown-variable",
        _mapping(containerImage="reg.local/xe:$KERNEL_VER"),
        f"{MAPPING}.containerImage",
        "unknown variable",
        None,
    ),
    Case(
        "dockerfile-configmap-empty",
        _mapping(build={"dockerfileConfigMap": {"name": ""}}),
        f"{MAPPING}.build.dockerfileConfigMap.name",
        api.DOCKERFILE_CONFIGMAP_MSG,
        f"build.dockerfileConfigMap.name: {api.DOCKERFILE_CONFIGMAP_MSG}",
    ),
    Case(
        "build-arg-unknown-variable",
        _build(buildArgs=[{"name": "A", "value": "${NOPE}"}]),
        f"{MAPPING}.build.buildArgs[0].value",
        "unknown variable $NOPE",
        f"value: {UNKNOWN_VARIABLE_MSG}",
    ),
]
