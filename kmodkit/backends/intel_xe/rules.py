"""Every rule a ClusterPolicy must follow, checked without a cluster.

The CRD's CEL rules (same messages, from ``kmodkit.backends.intel_xe.api``) plus what
CEL cannot check: kernel regexps are RE2, templates are well formed and use
known variables, images parse as full references, and ``<policy>-gpu`` fits
KMM's name budget together with the operator's namespace. ``kmodkit validate``
runs them; the plan runs the kernelModule part too, so a policy that slipped
past admission never reaches KMM half-checked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kmodkit.backends.intel_xe import api
from kmodkit.sdk import (
    LABEL_VALUE_RE,
    MAX_NAME_AND_NAMESPACE,
    QUALIFIED_NAME_RE,
    SIGN_DIGEST_MSG,
    SIGN_DIR_MSG,
    SIGN_SOURCE_MSG,
    TEMPLATE_VARIABLES,
    TOLERATION_EMPTY_KEY_MSG,
    TOLERATION_EQUAL_VALUE_MSG,
    TOLERATION_EXISTS_VALUE_MSG,
    TOLERATION_KEY_MSG,
    TOLERATION_SECONDS_MSG,
    ImageReferenceError,
    Problem,
    RegexpError,
    TemplateError,
    Toleration,
    check_re2,
    check_template,
    compile_re2,
    parse_image_reference,
    require_tag_or_digest,
    schema_problems,
    substitute,
    template_values,
)

DEFAULT_OPERATOR_NAMESPACE = "kmodkit-system"
"""The namespace ``kmodkit run`` uses unless told otherwise (KMODKIT_NAMESPACE)."""
# Stands in for a node's kernel when checking that an image template yields a
# valid reference: the Ubuntu 26.04 kernel the driver targets.
SAMPLE_KERNEL = "7.0.0-14-generic"

KM = "spec.kernelModule"


def validate_cluster_policy(obj: Mapping[str, Any]) -> list[Problem]:
    """Every problem with a ClusterPolicy body, for the operator namespace in KMODKIT_NAMESPACE."""
    namespace = os.environ.get("KMODKIT_NAMESPACE") or DEFAULT_OPERATOR_NAMESPACE
    return cluster_policy_problems(obj, namespace)


def cluster_policy_problems(obj: Mapping[str, Any], operator_namespace: str) -> list[Problem]:
    """Every problem with a ClusterPolicy body whose operator runs in ``operator_namespace``."""
    try:
        policy = api.ClusterPolicy.model_validate(obj)
    except ValidationError as err:
        return schema_problems(err)
    return [
        *name_problems(policy.metadata.name or "", operator_namespace),
        *_spec_problems(policy.spec),
    ]


def name_problems(name: str, operator_namespace: str) -> list[Problem]:
    """The policy's name: a DNS subdomain whose Module fits KMM's label keys."""
    if not name:
        return [Problem("metadata.name", "is required")]
    problems = []
    if not re.fullmatch(api.DNS_SUBDOMAIN_RE, name):
        problems.append(Problem("metadata.name", api.OBJECT_NAME_MSG))
    total = len(name) + len(api.MODULE_SUFFIX) + len(operator_namespace)
    if total > MAX_NAME_AND_NAMESPACE:
        problems.append(
            Problem(
                "metadata.name",
                f"{api.POLICY_NAME_LENGTH_MSG} (the Module {name}{api.MODULE_SUFFIX} in "
                f"namespace {operator_namespace} totals {total})",
            )
        )
    return problems


def _spec_problems(spec: api.ClusterPolicySpec) -> list[Problem]:
    problems = []
    if spec.dp is not None:
        problems += _device_plugin_problems(spec.dp)
    for path, image in (
        ("spec.dp.plugin", spec.dp.plugin if spec.dp else None),
        ("spec.dp.levelzero", spec.dp.levelzero if spec.dp else None),
        ("spec.dra.image", spec.dra.image if spec.dra else None),
        ("spec.xpu.image", spec.xpu.image if spec.xpu else None),
    ):
        if image:
            problems += _image_problems(path, image)
    if spec.pull_secret is not None and not re.fullmatch(
        api.DNS_SUBDOMAIN_RE, spec.pull_secret.name
    ):
        problems.append(Problem("spec.pullSecret.name", api.OBJECT_NAME_MSG))
    override = spec.xpu.config_map_override if spec.xpu else None
    if override and not re.fullmatch(api.DNS_SUBDOMAIN_RE, override):
        problems.append(Problem("spec.xpu.configMapOverride", api.OBJECT_NAME_MSG))
    problems += _toleration_problems(spec.tolerations or [])
    if spec.kernel_module is not None:
        problems += kernel_module_problems(spec.kernel_module)
    return problems


def _device_plugin_problems(dp: api.DevicePluginSpec) -> list[Problem]:
    problems = []
    if dp.allow_ids and dp.deny_ids:
        problems.append(Problem("spec.dp", api.IDS_BOTH_MSG))
    for field, ids in (("allowIDs", dp.allow_ids), ("denyIDs", dp.deny_ids)):
        for index, device_id in enumerate(ids or []):
            if not re.fullmatch(api.PCI_ID_RE, device_id):
                problems.append(
                    Problem(f"spec.dp.{field}[{index}]", f"{device_id!r} {api.PCI_ID_MSG}")
                )
    return problems


def _image_problems(path: str, image: str) -> list[Problem]:
    try:
        require_tag_or_digest(image)
    except ImageReferenceError as err:
        return [Problem(path, f"{image!r} {err}")]
    return []


def _toleration_problems(tolerations: list[Toleration]) -> list[Problem]:
    problems = []
    for index, toleration in enumerate(tolerations):
        path = f"spec.tolerations[{index}]"
        exists = toleration.operator == "Exists"
        if toleration.key and not re.fullmatch(QUALIFIED_NAME_RE, toleration.key):
            problems.append(Problem(f"{path}.key", TOLERATION_KEY_MSG))
        if not toleration.key and not exists:
            problems.append(Problem(f"{path}.operator", TOLERATION_EMPTY_KEY_MSG))
        if exists and toleration.value:
            problems.append(Problem(f"{path}.value", TOLERATION_EXISTS_VALUE_MSG))
        if (
            not exists
            and toleration.value is not None
            and not re.fullmatch(LABEL_VALUE_RE, toleration.value)
        ):
            problems.append(Problem(f"{path}.value", TOLERATION_EQUAL_VALUE_MSG))
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            problems.append(Problem(f"{path}.tolerationSeconds", TOLERATION_SECONDS_MSG))
    return problems


def kernel_module_problems(km: api.KernelModuleSpec) -> list[Problem]:
    """Every problem with spec.kernelModule beyond its schema."""
    problems = []
    if not re.fullmatch(api.MODULE_NAME_RE, km.module_name):
        problems.append(Problem(f"{KM}.moduleName", api.MODULE_NAME_MSG))
    if km.version and not re.fullmatch(LABEL_VALUE_RE, km.version):
        problems.append(Problem(f"{KM}.version", api.VERSION_MSG))
    if km.firmware_path and not km.firmware_path.startswith("/"):
        problems.append(Problem(f"{KM}.firmwarePath", api.FIRMWARE_PATH_MSG))
    for index, mapping in enumerate(km.kernel_mappings):
        problems += _mapping_problems(f"{KM}.kernelMappings[{index}]", mapping)
    return problems + _order_problems(km) + _sign_problems(km)


def _sign_problems(km: api.KernelModuleSpec) -> list[Problem]:
    """Files under /opt, templates that name known variables, something to sign per mapping."""
    problems = []
    owners = [(f"{KM}.sign", km.sign)] + [
        (f"{KM}.kernelMappings[{i}].sign", m.sign) for i, m in enumerate(km.kernel_mappings)
    ]
    for path, sign in owners:
        for index, entry in enumerate(sign.files_to_sign if sign else []):
            try:
                check_template(entry, TEMPLATE_VARIABLES)
            except TemplateError as err:
                problems.append(Problem(f"{path}.filesToSign[{index}]", str(err)))
            if not entry.startswith("/opt/"):
                problems.append(Problem(f"{path}.filesToSign[{index}]", SIGN_DIR_MSG))
    for index, mapping in enumerate(km.kernel_mappings):
        signs = [s for s in (km.sign, mapping.sign) if s is not None]
        if signs and mapping.build is None and not any(s.unsigned_image for s in signs):
            problems.append(Problem(f"{KM}.kernelMappings[{index}].sign", SIGN_SOURCE_MSG))
        if signs and "@" in mapping.container_image:
            problems.append(
                Problem(f"{KM}.kernelMappings[{index}].containerImage", SIGN_DIGEST_MSG)
            )
    return problems


def _mapping_problems(path: str, mapping: api.KernelMappingSpec) -> list[Problem]:
    problems = []
    if not mapping.regexp:
        problems.append(Problem(f"{path}.regexp", api.REGEXP_REQUIRED_MSG))
    else:
        try:
            check_re2(mapping.regexp)
            compile_re2(mapping.regexp)
        except RegexpError as err:
            problems.append(Problem(f"{path}.regexp", str(err)))
    if not mapping.container_image:
        problems.append(Problem(f"{path}.containerImage", api.MAPPING_IMAGE_REQUIRED_MSG))
    else:
        problems += _mapping_image_problems(f"{path}.containerImage", mapping.container_image)
    build = mapping.build
    if build is not None:
        if not build.dockerfile_config_map.name:
            problems.append(
                Problem(f"{path}.build.dockerfileConfigMap.name", api.DOCKERFILE_CONFIGMAP_MSG)
            )
        for index, arg in enumerate(build.build_args or []):
            try:
                check_template(arg.value, TEMPLATE_VARIABLES)
            except TemplateError as err:
                problems.append(Problem(f"{path}.build.buildArgs[{index}].value", str(err)))
    return problems


def _mapping_image_problems(path: str, image: str) -> list[Problem]:
    try:
        check_template(image, TEMPLATE_VARIABLES)
    except TemplateError as err:
        return [Problem(path, str(err))]
    sample = template_values(SAMPLE_KERNEL, name="policy-gpu", namespace="ns", for_tag=True)
    concrete = substitute(image, sample.values, sample.unavailable)
    try:
        parsed = parse_image_reference(concrete)
    except ImageReferenceError as err:
        return [Problem(path, f"{image!r} {err}")]
    if parsed.tag is None and parsed.digest is None:
        return [Problem(path, f"{image!r} {api.MAPPING_IMAGE_TAG_MSG}")]
    return []


def _order_problems(km: api.KernelModuleSpec) -> list[Problem]:
    order = km.modules_loading_order or []
    if not order:
        return []
    path = f"{KM}.modulesLoadingOrder"
    problems = []
    if len(order) < 2:
        problems.append(Problem(path, api.ORDER_SIZE_MSG))
    if order[0] != km.module_name:
        problems.append(
            Problem(f"{path}[0]", f"{api.ORDER_FIRST_MSG} ({km.module_name!r}), not {order[0]!r}")
        )
    seen: set[str] = set()
    for index, name in enumerate(order):
        if name in seen:
            problems.append(Problem(f"{path}[{index}]", f"{api.ORDER_DUPLICATE_MSG} ({name!r})"))
            break
        seen.add(name)
    return problems
