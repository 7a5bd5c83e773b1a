"""Every rule a Module must follow, checked without a cluster.

These are the CRD's admission rules (the CEL in ``kmodkit.core.api``, with the same
messages) plus what CEL cannot check: that regexps are RE2, that templates
are well formed and use known variables, and that images parse as full
references. ``kmodkit validate`` runs them; so can any code holding a Module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kmodkit.agent.config import forces_removal
from kmodkit.core.api import API_VERSION, KIND, KMM_API_VERSION, Build, Module, Sign, Toleration
from kmodkit.core.api import common as common_api
from kmodkit.core.api import device_plugin as device_plugin_api
from kmodkit.core.api import module as module_api
from kmodkit.core.engine.images import ImageReferenceError, require_tag_or_digest
from kmodkit.core.engine.kernel_mapping import CONTAINER_PATH, mapping_path
from kmodkit.core.engine.re2 import RegexpError, check_re2, compile_re2
from kmodkit.core.engine.templating import TemplateError, check_template, substitute
from kmodkit.core.kernel import TEMPLATE_VARIABLES, template_values
from kmodkit.core.schema.validation import Problem, ValidatorRegistry, schema_problems

# Stands in for a node's kernel when checking that an image template yields a
# valid reference; any kernel with three components would do.
SAMPLE_KERNEL = "5.14.0-284.30.1.el9_2.x86_64"

_KMM_ONLY_FIELDS = {
    "dra": "is KMM's DRA driver support, which kmodkit leaves to backends; remove it or keep "
    "this Module on KMM",
}


# Advice for required fields whose absence has a common cause.
_REQUIRED = {
    "spec.selector": "is required; write {} to select every node",
    f"{CONTAINER_PATH}.kernelMappings": "is required: list at least one mapping from kernels "
    "to images",
}


# The same, for fields that occur in several places, by the end of their path.
_REQUIRED_ENDING = {
    ".sign.keySecret": 'is required: name the Secret whose key "key" holds the private '
    "signing key (PEM)",
    ".sign.certSecret": 'is required: name the Secret whose key "cert" holds the signing '
    "certificate the kernel is to trust",
}


def _advised(problem: Problem) -> Problem:
    if problem.message != "is required":
        return problem
    advice = _REQUIRED.get(problem.path) or next(
        (text for end, text in _REQUIRED_ENDING.items() if problem.path.endswith(end)), None
    )
    return Problem(problem.path, advice) if advice else problem


def register_module_validators(registry: ValidatorRegistry) -> None:
    """Validate kmodkit Modules, and KMM Modules by the same rules."""
    registry.register(API_VERSION, KIND, validate_module)
    registry.register(KMM_API_VERSION, KIND, validate_module)


def validate_module(obj: Mapping[str, Any]) -> list[Problem]:
    """Every problem with a kmodkit or KMM Module body."""
    problems = []
    spec = obj.get("spec")
    if obj.get("apiVersion") == KMM_API_VERSION and isinstance(spec, Mapping) and "rollout" in spec:
        problems.append(
            Problem(
                "spec.rollout",
                "is a kmodkit extension that KMM's Module does not have; use apiVersion "
                f"{API_VERSION} or remove it",
            )
        )
    try:
        module = Module.model_validate(obj)
    except ValidationError as err:
        found = schema_problems(err, lambda name: _KMM_ONLY_FIELDS.get(name, ""))
        return problems + [_advised(p) for p in found]
    return problems + check_module(module)


def check_module(module: Module) -> list[Problem]:
    """Every rule beyond the schema, on a Module that parsed."""
    return [
        *_check_name(module),
        *_check_tolerations(module.spec.tolerations or []),
        *_check_container(module),
        *_check_device_plugin(module),
        *_check_rollout(module),
    ]


def _check_name(module: Module) -> list[Problem]:
    name, namespace = module.metadata.name, module.metadata.namespace or ""
    if not name:
        return [Problem("metadata.name", "is required")]
    problems = []
    if not re.fullmatch(module_api.NAME_RE, name):
        problems.append(Problem("metadata.name", module_api.NAME_FORMAT_MSG))
    # Without a namespace, the shortest one (a single character) is assumed.
    if len(name) + max(len(namespace), 1) > module_api.MAX_NAME_AND_NAMESPACE:
        problems.append(Problem("metadata.name", module_api.NAME_LENGTH_MSG))
    return problems


def _check_tolerations(tolerations: list[Toleration]) -> list[Problem]:
    problems = []
    for index, toleration in enumerate(tolerations):
        path = f"spec.tolerations[{index}]"
        exists = toleration.operator == "Exists"
        if toleration.key and not re.fullmatch(common_api.QUALIFIED_NAME_RE, toleration.key):
            problems.append(Problem(f"{path}.key", common_api.TOLERATION_KEY_MSG))
        if not toleration.key and not exists:
            problems.append(Problem(f"{path}.operator", common_api.TOLERATION_EMPTY_KEY_MSG))
        if exists and toleration.value:
            problems.append(Problem(f"{path}.value", common_api.TOLERATION_EXISTS_VALUE_MSG))
        if (
            not exists
            and toleration.value is not None
            and not re.fullmatch(common_api.LABEL_VALUE_RE, toleration.value)
        ):
            problems.append(Problem(f"{path}.value", common_api.TOLERATION_EQUAL_VALUE_MSG))
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            problems.append(Problem(f"{path}.tolerationSeconds", common_api.TOLERATION_SECONDS_MSG))
    return problems


def _check_container(module: Module) -> list[Problem]:
    if module.spec.module_loader is None:
        if module.spec.device_plugin is None:
            return [Problem("spec", module_api.NOTHING_TO_RUN_MSG)]
        return []
    container = module.spec.module_loader.container
    name, namespace = module.metadata.name or "", module.metadata.namespace or ""
    problems = []
    if container.container_image:
        problems += _check_image(
            container.container_image, f"{CONTAINER_PATH}.containerImage", name, namespace
        )
    problems += _check_build(container.build, CONTAINER_PATH)
    problems += _check_in_tree(container, CONTAINER_PATH)
    for index, mapping in enumerate(container.kernel_mappings):
        path = mapping_path(index)
        problems += _check_in_tree(mapping, path)
        if mapping.literal and mapping.regexp:
            problems.append(Problem(f"{path}.literal", module_api.MAPPING_BOTH_MSG))
        if not mapping.literal and not mapping.regexp:
            problems.append(Problem(path, module_api.MAPPING_NEITHER_MSG))
        if mapping.regexp:
            problems += _check_regexp(mapping.regexp, f"{path}.regexp")
        if mapping.container_image:
            problems += _check_image(
                mapping.container_image, f"{path}.containerImage", name, namespace
            )
        elif not container.container_image:
            problems.append(Problem(f"{path}.containerImage", module_api.MAPPING_IMAGE_MSG))
        problems += _check_build(mapping.build, path)
    return problems + _check_modprobe(module) + _check_signing(module)


def _check_in_tree(
    spec: module_api.KernelMapping | module_api.ModuleLoaderContainer, path: str
) -> list[Problem]:
    if spec.in_tree_modules_to_remove is not None and spec.in_tree_module_to_remove is not None:
        return [Problem(f"{path}.inTreeModuleToRemove", module_api.IN_TREE_BOTH_MSG)]
    return []


def _check_device_plugin(module: Module) -> list[Problem]:
    plugin = module.spec.device_plugin
    if plugin is None:
        return []
    problems = []
    for i, volume in enumerate(plugin.volumes or []):
        path = f"spec.devicePlugin.volumes[{i}]"
        sources = (volume.host_path, volume.config_map, volume.secret, volume.empty_dir)
        if sum(source is not None for source in sources) != 1:
            problems.append(Problem(path, device_plugin_api.VOLUME_SOURCE_MSG))
        if volume.host_path is not None and not re.fullmatch(
            device_plugin_api.HOST_PATH_RE, volume.host_path.path
        ):
            problems.append(Problem(f"{path}.hostPath.path", device_plugin_api.HOST_PATH_MSG))
    return problems


def _check_regexp(pattern: str, path: str) -> list[Problem]:
    try:
        check_re2(pattern)
        compile_re2(pattern)
    except RegexpError as err:
        return [Problem(path, str(err))]
    return []


def _check_image(image: str, path: str, name: str, namespace: str) -> list[Problem]:
    try:
        check_template(image, TEMPLATE_VARIABLES)
    except TemplateError as err:
        return [Problem(path, str(err))]
    sample = template_values(
        SAMPLE_KERNEL, name=name or "module", namespace=namespace or "default", for_tag=True
    )
    try:
        require_tag_or_digest(substitute(image, sample.values, sample.unavailable))
    except ImageReferenceError as err:
        return [Problem(path, f"{image!r} {err}")]
    return []


def _check_build(build: Build | None, owner_path: str) -> list[Problem]:
    problems = []
    for index, arg in enumerate((build.build_args or []) if build else []):
        try:
            check_template(arg.value, TEMPLATE_VARIABLES)
        except TemplateError as err:
            problems.append(Problem(f"{owner_path}.build.buildArgs[{index}].value", str(err)))
    return problems


def _check_signing(module: Module) -> list[Problem]:
    """The sign sections: their files, their images, and something to sign for each mapping."""
    container = module.spec.loader.container
    name, namespace = module.metadata.name or "", module.metadata.namespace or ""
    prefix = container.modprobe.dir_name.rstrip("/") + "/"
    problems = []
    owners = [(container.sign, CONTAINER_PATH)] + [
        (mapping.sign, mapping_path(index))
        for index, mapping in enumerate(container.kernel_mappings)
    ]
    for sign, owner in owners:
        if sign is not None:
            problems += _check_sign(sign, f"{owner}.sign", prefix, name, namespace)
    for index, mapping in enumerate(container.kernel_mappings):
        if container.sign is None and mapping.sign is None:
            continue
        path = mapping_path(index)
        unsigned = (mapping.sign and mapping.sign.unsigned_image) or (
            container.sign and container.sign.unsigned_image
        )
        if not unsigned and mapping.build is None and container.build is None:
            problems.append(Problem(f"{path}.sign", module_api.SIGN_SOURCE_MSG))
        image_path = (
            f"{path}.containerImage"
            if mapping.container_image
            else f"{CONTAINER_PATH}.containerImage"
        )
        if "@" in (mapping.container_image or container.container_image or ""):
            problems.append(Problem(image_path, module_api.SIGN_DIGEST_MSG))
    return problems


def _check_sign(sign: Sign, path: str, prefix: str, name: str, namespace: str) -> list[Problem]:
    problems = []
    if sign.unsigned_image:
        problems += _check_image(sign.unsigned_image, f"{path}.unsignedImage", name, namespace)
    for index, entry in enumerate(sign.files_to_sign):
        entry_path = f"{path}.filesToSign[{index}]"
        try:
            check_template(entry, TEMPLATE_VARIABLES)
        except TemplateError as err:
            problems.append(Problem(entry_path, str(err)))
        if not entry.startswith(prefix):
            problems.append(Problem(entry_path, module_api.SIGN_DIR_MSG))
    return problems


def _check_modprobe(module: Module) -> list[Problem]:
    modprobe = module.spec.loader.container.modprobe
    path = f"{CONTAINER_PATH}.modprobe"
    problems = []
    if modprobe.module_name and modprobe.raw_args is not None:
        problems.append(Problem(f"{path}.rawArgs", module_api.RAW_ARGS_WITH_NAME_MSG))
    if not modprobe.module_name and modprobe.raw_args is None:
        problems.append(Problem(f"{path}.moduleName", module_api.MODULE_NAME_MSG))
    order = modprobe.modules_loading_order
    if order is not None:
        order_path = f"{path}.modulesLoadingOrder"
        if len(order) < 2:
            problems.append(Problem(order_path, module_api.ORDER_SIZE_MSG))
        if order and (not modprobe.module_name or order[0] != modprobe.module_name):
            problems.append(Problem(order_path, module_api.ORDER_FIRST_MSG))
        if len(set(order)) != len(order):
            problems.append(Problem(order_path, module_api.ORDER_DUPLICATE_MSG))
    if modprobe.args is not None and any(forces_removal(a) for a in modprobe.args.unload):
        problems.append(Problem(f"{path}.args.unload", module_api.UNLOAD_FORCE_MSG))
    return problems


def _check_rollout(module: Module) -> list[Problem]:
    value = module.spec.rollout_policy().max_unavailable
    valid = (
        value >= 1
        if isinstance(value, int)
        else re.fullmatch(module_api.MAX_UNAVAILABLE_PERCENT_RE, value) is not None
    )
    if valid:
        return []
    return [Problem("spec.rollout.maxUnavailable", module_api.MAX_UNAVAILABLE_MSG)]
