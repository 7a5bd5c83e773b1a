"""Which kernel mapping serves a kernel, and the settings that result.

This is KMM's mapping resolution: the first mapping in list order that matches
wins (a literal exactly, a regexp anywhere in the kernel string), and its
settings are merged over the container-level defaults exactly as KMM merges
them. kmodkit differs only where KMM is quietly wrong: template errors and
unknown variables are reported instead of expanding to nothing, build
arguments are templated too, and the final image must be a real reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmodkit.core.api import Build, BuildArg, KernelMapping, Module, RegistryTLS, Sign
from kmodkit.core.api.module import SIGN_DIGEST_MSG, SIGN_DIR_MSG, SIGN_SOURCE_MSG
from kmodkit.core.engine.images import (
    ImageReferenceError,
    parse_image_reference,
    require_tag_or_digest,
)
from kmodkit.core.engine.re2 import RegexpError, re2_search
from kmodkit.core.engine.templating import TemplateError, substitute
from kmodkit.core.kernel import (
    KERNEL_FULL_VERSION,
    KERNEL_VERSION,
    MOD_NAME,
    MOD_NAMESPACE,
    TemplateValues,
    template_values,
)

CONTAINER_PATH = "spec.moduleLoader.container"
UNSIGNED_SUFFIX = "-unsigned"
"""Appended to containerImage's tag to name what a build pushes before it is signed."""
MAX_TAG_LENGTH = 128


def mapping_path(index: int) -> str:
    """Field path of the kernel mapping at ``index``."""
    return f"{CONTAINER_PATH}.kernelMappings[{index}]"


class ResolveError(ValueError):
    """A Module that cannot be resolved for a kernel, with the field at fault.

    ``mapping_index`` is the mapping that matched the kernel, when the error
    arose after matching (in templating or merging).
    """

    def __init__(self, path: str, message: str, mapping_index: int | None = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
        self.mapping_index = mapping_index


@dataclass(frozen=True)
class ResolvedSign:
    """The merged sign section for one kernel, every template substituted."""

    unsigned_image: str
    """Where the unsigned modules are: sign.unsignedImage, or what the build pushes."""
    unsigned_image_registry_tls: RegistryTLS | None
    key_secret: str
    cert_secret: str
    files_to_sign: tuple[str, ...]


@dataclass(frozen=True)
class ResolvedMapping:
    """What a Module means for one kernel (KMM's "ModuleLoaderData")."""

    kernel: str
    mapping_index: int
    container_image: str
    """The image with every template variable substituted."""
    registry_tls: RegistryTLS | None
    build: Build | None
    """The merged build, with templated and injected build arguments; None if no build."""
    in_tree_modules_to_remove: tuple[str, ...]
    sign: ResolvedSign | None = None
    """The merged sign section; None if the image is not signed."""

    @property
    def build_target(self) -> str:
        """The image a build pushes: the unsigned image when it is signed afterwards."""
        return self.sign.unsigned_image if self.sign is not None else self.container_image


@dataclass(frozen=True)
class NoMatch:
    """No kernel mapping matches the kernel: the Module does not apply to such nodes."""

    kernel: str


def find_mapping(mappings: list[KernelMapping], kernel: str) -> int | None:
    """Index of the first mapping that matches ``kernel``, or None.

    Raises ResolveError for a regexp that is not RE2 or runs too long, but
    only when the search reaches it, as KMM does.
    """
    for index, mapping in enumerate(mappings):
        if mapping.literal:
            if mapping.literal == kernel:
                return index
            continue
        if not mapping.regexp:
            continue
        try:
            if re2_search(mapping.regexp, kernel):
                return index
        except RegexpError as err:
            raise ResolveError(f"{mapping_path(index)}.regexp", str(err)) from None
    return None


def resolve(module: Module, kernel: str) -> ResolvedMapping | NoMatch:
    """Resolve ``module`` for ``kernel`` (already stripped with ``node_kernel``)."""
    name, namespace = module.metadata.name, module.metadata.namespace
    if not name:
        raise ResolveError("metadata.name", "is required")
    if not namespace:
        raise ResolveError("metadata.namespace", "is required")
    container = module.spec.loader.container
    index = find_mapping(container.kernel_mappings, kernel)
    if index is None:
        return NoMatch(kernel)
    try:
        return _resolve_mapping(module, index, kernel, name, namespace)
    except ResolveError as err:
        raise ResolveError(err.path, err.message, mapping_index=index) from None


def _resolve_mapping(
    module: Module, index: int, kernel: str, name: str, namespace: str
) -> ResolvedMapping:
    container = module.spec.loader.container
    mapping = container.kernel_mappings[index]

    image_values = template_values(kernel, name=name, namespace=namespace, for_tag=True)
    if mapping.container_image:
        image, image_path = mapping.container_image, f"{mapping_path(index)}.containerImage"
    elif container.container_image:
        image, image_path = container.container_image, f"{CONTAINER_PATH}.containerImage"
    else:
        raise ResolveError(
            f"{mapping_path(index)}.containerImage",
            f"is empty and {CONTAINER_PATH}.containerImage is not set; set one of them",
        )
    image = _substitute(image, image_values, image_path)
    try:
        require_tag_or_digest(image)
    except ImageReferenceError as err:
        raise ResolveError(
            image_path, f"becomes {image!r} for kernel {kernel!r}, which {err}"
        ) from None

    in_tree = (
        mapping.in_tree_modules_to_remove
        if mapping.in_tree_modules_to_remove is not None
        else container.in_tree_modules_to_remove or []
    )
    # KMM's deprecated singular: the mapping's wins over the container's, and it
    # replaces whichever list applied.
    single = mapping.in_tree_module_to_remove or container.in_tree_module_to_remove
    if single:
        in_tree = [single]
    build = _resolved_build(module, index, kernel, name, namespace)
    return ResolvedMapping(
        kernel=kernel,
        mapping_index=index,
        container_image=image,
        registry_tls=mapping.registry_tls
        if mapping.registry_tls is not None
        else container.registry_tls,
        build=build,
        in_tree_modules_to_remove=tuple(in_tree),
        sign=_resolved_sign(module, index, kernel, image, image_path, build is not None),
    )


def merge_signs(container_sign: Sign | None, mapping_sign: Sign | None) -> Sign | None:
    """Merge a mapping's sign over the container's, as KMM does.

    With one side only, that side is used whole. With both, the mapping's
    unsigned image, key and certificate win, and the files are the container's
    followed by the mapping's. KMM takes the unsigned image's TLS from the
    container alone; a mapping that sets it is honoured here.
    """
    if container_sign is None or mapping_sign is None:
        return mapping_sign if mapping_sign is not None else container_sign
    return container_sign.model_copy(
        update={
            "unsigned_image": mapping_sign.unsigned_image or container_sign.unsigned_image,
            "unsigned_image_registry_tls": mapping_sign.unsigned_image_registry_tls
            or container_sign.unsigned_image_registry_tls,
            "key_secret": mapping_sign.key_secret,
            "cert_secret": mapping_sign.cert_secret,
            "files_to_sign": [*container_sign.files_to_sign, *mapping_sign.files_to_sign],
        }
    )


def _resolved_sign(
    module: Module, index: int, kernel: str, image: str, image_path: str, built: bool
) -> ResolvedSign | None:
    container = module.spec.loader.container
    mapping = container.kernel_mappings[index]
    sign = merge_signs(container.sign, mapping.sign)
    if sign is None:
        return None
    name, namespace = module.metadata.name or "", module.metadata.namespace or ""
    owner = f"{mapping_path(index)}.sign" if mapping.sign is not None else f"{CONTAINER_PATH}.sign"
    image_values = template_values(kernel, name=name, namespace=namespace, for_tag=True)
    path_values = template_values(kernel, name=name, namespace=namespace, for_tag=False)
    reference = parse_image_reference(image)
    if reference.digest is not None:
        raise ResolveError(image_path, f"becomes {image!r}, {SIGN_DIGEST_MSG}")
    if sign.unsigned_image:
        unsigned_path = f"{owner}.unsignedImage"
        unsigned = _substitute(sign.unsigned_image, image_values, unsigned_path)
        try:
            require_tag_or_digest(unsigned)
        except ImageReferenceError as err:
            raise ResolveError(
                unsigned_path, f"becomes {unsigned!r} for kernel {kernel!r}, which {err}"
            ) from None
    elif built:
        tag = f"{reference.tag}{UNSIGNED_SUFFIX}"
        if len(tag) > MAX_TAG_LENGTH:
            raise ResolveError(
                f"{owner}.unsignedImage",
                f"is needed for kernel {kernel!r}: the tag of {image!r} is too long to append "
                f"{UNSIGNED_SUFFIX!r} to it for the unsigned build; name the unsigned image",
            )
        unsigned = f"{reference.name}:{tag}"
    else:
        raise ResolveError(f"{mapping_path(index)}.sign", SIGN_SOURCE_MSG)
    # The merge puts the container's files first: each is named by the field it came from.
    paths = [
        f"{owner_path}.sign.filesToSign[{position}]"
        for owner_path, part in (
            (CONTAINER_PATH, container.sign),
            (mapping_path(index), mapping.sign),
        )
        if part is not None
        for position in range(len(part.files_to_sign))
    ]
    prefix = container.modprobe.dir_name.rstrip("/") + "/"
    files = []
    for path, entry in zip(paths, sign.files_to_sign, strict=True):
        if not entry.startswith(prefix):
            raise ResolveError(path, SIGN_DIR_MSG)
        files.append(_substitute(entry, path_values, path))
    return ResolvedSign(
        unsigned_image=unsigned,
        unsigned_image_registry_tls=sign.unsigned_image_registry_tls,
        key_secret=sign.key_secret.name,
        cert_secret=sign.cert_secret.name,
        files_to_sign=tuple(files),
    )


def _substitute(text: str, values: TemplateValues, path: str) -> str:
    try:
        return substitute(text, values.values, values.unavailable)
    except TemplateError as err:
        raise ResolveError(path, str(err)) from None


def _resolved_build(
    module: Module, index: int, kernel: str, name: str, namespace: str
) -> Build | None:
    container = module.spec.loader.container
    values = template_values(kernel, name=name, namespace=namespace, for_tag=False)
    container_build = _templated(container.build, values, CONTAINER_PATH)
    mapping_build = _templated(container.kernel_mappings[index].build, values, mapping_path(index))
    build = merge_builds(container_build, mapping_build)
    if build is None:
        return None
    injected = [
        BuildArg(name=KERNEL_VERSION, value=kernel),
        BuildArg(name=KERNEL_FULL_VERSION, value=kernel),
        BuildArg(name=MOD_NAME, value=name),
        BuildArg(name=MOD_NAMESPACE, value=namespace),
    ]
    return build.model_copy(update={"build_args": override_build_args(build.build_args, injected)})


def _templated(build: Build | None, values: TemplateValues, owner_path: str) -> Build | None:
    if build is None or not build.build_args:
        return build
    args = [
        arg.model_copy(
            update={
                "value": _substitute(
                    arg.value, values, f"{owner_path}.build.buildArgs[{position}].value"
                )
            }
        )
        for position, arg in enumerate(build.build_args)
    ]
    return build.model_copy(update={"build_args": args})


def merge_builds(container_build: Build | None, mapping_build: Build | None) -> Build | None:
    """Merge a mapping's build over the container's, as KMM does.

    With one side only, that side is used whole. With both, the container's is
    the base: the mapping's Dockerfile wins, build args are overridden by name,
    secrets are concatenated, and the base-image TLS and build-node selector
    come from the container alone.
    """
    if container_build is None or mapping_build is None:
        return mapping_build if mapping_build is not None else container_build
    return container_build.model_copy(
        update={
            "dockerfile_config_map": mapping_build.dockerfile_config_map,
            "build_args": override_build_args(
                container_build.build_args, mapping_build.build_args or []
            ),
            "secrets": [*(container_build.secrets or []), *(mapping_build.secrets or [])] or None,
            # KMM reads it from the container alone; a mapping that sets it is honoured.
            "kaniko_params": mapping_build.kaniko_params or container_build.kaniko_params,
        }
    )


def override_build_args(base: list[BuildArg] | None, overrides: list[BuildArg]) -> list[BuildArg]:
    """``base`` with each override replacing the args of its name in place.

    Overrides whose name ``base`` lacks are appended, sorted by name, as KMM
    orders them.
    """
    result = list(base or [])
    appended: list[BuildArg] = []
    for override in overrides:
        positions = [i for i, arg in enumerate(result) if arg.name == override.name]
        for position in positions:
            result[position] = override
        if not positions:
            appended.append(override)
    return result + sorted(appended, key=lambda arg: arg.name)
