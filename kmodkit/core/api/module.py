"""The ``Module`` resource: KMM's ``v1beta1`` Module, plus kmodkit's rollout policy.

Field names and shapes follow upstream ``kmm.sigs.x-k8s.io/v1beta1`` exactly, so
a Module body written for KMM is a kmodkit Module once its ``apiVersion`` is
switched, and the reverse holds for every body that does not use ``rollout``.
kmodkit's additions live only in fields KMM does not have (``spec.rollout`` and
the richer status).

The CEL rules attached here are the admission checks; ``kmodkit.core.engine.module_rules``
runs the same checks (and those CEL cannot express) offline, and shares these
messages so both say the same thing.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field

from kmodkit.core.api.base import (
    AbsolutePath,
    ImageRef,
    KubeModel,
    LabelSelector,
    ShortName,
    Text,
    cel,
    cel_rules,
)
from kmodkit.core.api.common import LocalObjectReference, ObjectMeta, RegistryTLS, Toleration
from kmodkit.core.api.device_plugin import DevicePlugin
from kmodkit.core.api.status import ModuleStatus
from kmodkit.core.kernel import TEMPLATE_VARIABLES

API_VERSION: Final = "kmodkit.io/v1alpha1"
GROUP, _, VERSION = API_VERSION.partition("/")
PLURAL = "modules"
KMM_API_VERSION: Final = "kmm.sigs.x-k8s.io/v1beta1"
KIND: Final = "Module"

# KMM derives node-label keys such as
# ``beta.kmm.node.kubernetes.io/version-schedule-pod.<ns>.<name>`` from the
# Module; the name part of a label key holds at most 63 characters, which
# leaves 41 for ``<ns>`` and ``<name>`` together.
MAX_NAME_AND_NAMESPACE = 41

# A tag ends the last path component, or a digest ends the reference. Template
# variables such as ${KERNEL_FULL_VERSION} contain none of '/', ':' or '@', so
# they count as a tag as they stand.
IMAGE_TAG_OR_DIGEST_CEL = (
    "self == '' || self.matches('^[^@]*:[^/:@]+$') "
    "|| self.matches('@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$')"
)
IMAGE_TAG_MSG = (
    "needs an explicit tag or digest, e.g. "
    "registry.example.com/org/driver:${KERNEL_FULL_VERSION}; without one every kernel "
    "would share the image's :latest"
)
MAPPING_BOTH_MSG = (
    "cannot be combined with regexp in one kernel mapping; keep literal to match one exact "
    "kernel, or regexp to match a family of kernels"
)
NOTHING_TO_RUN_MSG = (
    "give moduleLoader (the kernel module to load) or devicePlugin (a device plugin for an "
    "in-tree driver), or both"
)
UNLOAD_FORCE_MSG = (
    "must not force a removal (-f, --force...): forcing out a module in use corrupts "
    "the kernel; kmodkit refuses and reports a busy module instead"
)
REGEXP_MSG = "is not a valid RE2 regular expression (no lookaround or backreferences)"
IN_TREE_BOTH_MSG = (
    "inTreeModuleToRemove (deprecated) and inTreeModulesToRemove are both set; "
    "keep only inTreeModulesToRemove"
)
_IN_TREE_RULE = cel(
    "!(has(self.inTreeModulesToRemove) && has(self.inTreeModuleToRemove))",
    IN_TREE_BOTH_MSG,
    subject="inTreeModuleToRemove",
    field_path=".inTreeModuleToRemove",
)
MAPPING_NEITHER_MSG = (
    "a kernel mapping needs regexp or literal; use literal for one exact kernel or regexp "
    "(RE2 syntax, matched anywhere in the kernel string) for a family"
)
MAPPING_IMAGE_MSG = (
    "is empty while spec.moduleLoader.container.containerImage is not set either; set the "
    "mapping's image or a default image on the container"
)
RAW_ARGS_WITH_NAME_MSG = (
    "cannot be used together with moduleName; use args to add options to modprobe, or drop "
    "moduleName to run rawArgs.load and rawArgs.unload verbatim"
)
MODULE_NAME_MSG = "is required unless rawArgs gives both the load and the unload command"
ORDER_SIZE_MSG = (
    "needs at least 2 entries (moduleName first, then the modules to load before it); "
    "remove the field to load moduleName alone"
)
ORDER_FIRST_MSG = "must start with moduleName"
ORDER_DUPLICATE_MSG = "lists a module more than once; remove the duplicates"
VERSION_SWITCH_MSG = (
    "cannot change between empty and set on an existing Module (changing one version to "
    "another is fine); delete the Module and create it again"
)
MAX_UNAVAILABLE_MSG = (
    "must be a whole number of nodes of at least 1, or a percentage from 1% to 100%"
)
MAX_UNAVAILABLE_PERCENT_RE = r"^([1-9][0-9]?|100)%$"
# Module names become parts of label keys and pod names, so they must be
# DNS-1123 subdomains; the apiserver checks this at admission, the offline
# validator repeats it.
NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
NAME_FORMAT_MSG = (
    "must be lowercase letters, digits, '-' and '.', starting and ending with a letter or "
    "digit, because it becomes part of node-label keys and pod names"
)
NAME_LENGTH_MSG = (
    f"together with metadata.namespace must be at most {MAX_NAME_AND_NAMESPACE} characters, "
    "because node-label keys are built from both; choose a shorter name"
)

_IMAGE_RULE = cel(IMAGE_TAG_OR_DIGEST_CEL, IMAGE_TAG_MSG, subject="containerImage")
# Every $NAME or ${NAME...} must name a known variable. The engine's own parser
# checks the whole syntax (unclosed braces, nesting); this is what CEL can say.
_KNOWN = "|".join(TEMPLATE_VARIABLES)
# Each reference (one or more in a row) is followed by a character that cannot
# continue a name; one regular expression keeps the rule within the apiserver's cost budget.
KNOWN_VARIABLES_CEL = f"self.matches('^(?:[^$]|(?:[$][{{]?(?:{_KNOWN}))+(?:[^$A-Za-z0-9_]|$))*$')"
UNKNOWN_VARIABLE_MSG = "names an unknown template variable; the known ones are " + ", ".join(
    f"${{{v}}}" for v in TEMPLATE_VARIABLES
)
_IMAGE_VARIABLES_RULE = cel(KNOWN_VARIABLES_CEL, UNKNOWN_VARIABLE_MSG, subject="containerImage")
_BUILD_ARG_VARIABLES_RULE = cel(KNOWN_VARIABLES_CEL, UNKNOWN_VARIABLE_MSG, subject="value")
_UNSIGNED_IMAGE_RULE = cel(IMAGE_TAG_OR_DIGEST_CEL, IMAGE_TAG_MSG, subject="unsignedImage")
_UNSIGNED_VARIABLES_RULE = cel(KNOWN_VARIABLES_CEL, UNKNOWN_VARIABLE_MSG, subject="unsignedImage")
MAX_FILES_TO_SIGN = 32
SIGN_FILE_PATTERN = r"^/[A-Za-z0-9._+@=/*?\[\]${}-]*$"
SIGN_FILE_MSG = (
    "must be an absolute path in the image, or a glob (*, ?, [...]), made of letters, digits "
    "and ._+@=/- (template variables such as ${KERNEL_FULL_VERSION} allowed)"
)
SIGN_DIR_MSG = (
    "must lie under spec.moduleLoader.container.modprobe.dirName (default /opt), where the "
    "loader reads the modules from"
)
SIGN_SOURCE_MSG = (
    "needs something to sign: set sign.unsignedImage, or a build (on the mapping or the "
    "container) whose result is signed"
)
SIGN_DIGEST_MSG = (
    "cannot pin a digest while sign is set: the signed image is pushed under this reference, "
    "so it needs a tag"
)
MAX_BUILD_ARGS = 16
MAX_KERNEL_MAPPINGS = 64
_ORDER_SET = "has(self.modulesLoadingOrder)"
# modprobe.dirName with one trailing '/', as the prefix every file to sign must start with.
_DIR = "(has(self.modprobe.dirName) ? self.modprobe.dirName : '/opt')"
_DIR_PREFIX = f"({_DIR}.endsWith('/') ? {_DIR} : {_DIR} + '/')"
_NAME_SET = "(has(self.moduleName) && self.moduleName != '')"


# A file to sign: a path or glob in the image, templated with the kernel variables.
# 32 entries of 256 characters in each of 64 mappings keep its rules within the apiserver's
# cost budget; globs name many modules in one entry.
DeviceGlob = Annotated[str, Field(max_length=1024, pattern=r"^/dev/[A-Za-z0-9._+@=/*?\[\]-]+$")]
SignedFile = Annotated[
    str,
    Field(
        max_length=256,
        pattern=SIGN_FILE_PATTERN,
        json_schema_extra=cel_rules(
            cel(KNOWN_VARIABLES_CEL, UNKNOWN_VARIABLE_MSG, subject="filesToSign")
        ),
    ),
]


class ModprobeArgs(KubeModel):
    """Extra arguments for the modprobe load and unload commands."""

    load: list[Text] = Field(min_length=1, max_length=64)
    """Arguments for loading."""
    unload: Annotated[
        list[Text],
        Field(
            min_length=1,
            max_length=64,
            json_schema_extra=cel_rules(
                cel(
                    "self.all(a, !a.startsWith('--force') "
                    "&& !(a.startsWith('-') && !a.startsWith('--') && a.contains('f')))",
                    UNLOAD_FORCE_MSG,
                    subject="unload",
                )
            ),
        ),
    ]
    """Arguments for unloading (never a force flag)."""


class ModprobeSpec(KubeModel):
    """How the module is loaded and unloaded with modprobe."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                f"!{_NAME_SET} || !has(self.rawArgs)",
                RAW_ARGS_WITH_NAME_MSG,
                subject="rawArgs",
                field_path=".rawArgs",
            ),
            cel(
                f"{_NAME_SET} || has(self.rawArgs)",
                MODULE_NAME_MSG,
                subject="moduleName",
                field_path=".moduleName",
            ),
            cel(
                f"!{_ORDER_SET} || size(self.modulesLoadingOrder) >= 2",
                ORDER_SIZE_MSG,
                subject="modulesLoadingOrder",
                field_path=".modulesLoadingOrder",
            ),
            cel(
                f"!{_ORDER_SET} || size(self.modulesLoadingOrder) == 0 "
                f"|| ({_NAME_SET} && self.modulesLoadingOrder[0] == self.moduleName)",
                ORDER_FIRST_MSG,
                subject="modulesLoadingOrder",
                field_path=".modulesLoadingOrder",
            ),
            cel(
                f"!{_ORDER_SET} || self.modulesLoadingOrder.all(m, "
                "self.modulesLoadingOrder.exists_one(o, o == m))",
                ORDER_DUPLICATE_MSG,
                subject="modulesLoadingOrder",
                field_path=".modulesLoadingOrder",
            ),
        )
    )

    module_name: ShortName | None = None
    """Name of the kernel module to load (as given to modprobe)."""
    parameters: list[Text] | None = Field(default=None, max_length=64)
    """Module parameters passed after the module name."""
    dir_name: AbsolutePath = "/opt"
    """Directory in the image that holds lib/modules/<kernel>."""
    args: ModprobeArgs | None = None
    """Extra modprobe arguments, added to kmodkit's own."""
    raw_args: ModprobeArgs | None = None
    """Complete modprobe command lines, used instead of kmodkit's."""
    firmware_path: AbsolutePath | None = None
    """Directory in the image whose contents are copied to the host firmware path."""
    modules_loading_order: list[ShortName] | None = Field(default=None, max_length=64)
    """moduleName followed by the modules that must be loaded before it."""


class BuildArg(KubeModel):
    """One build argument for the Dockerfile."""

    name: ShortName
    # 512 characters, 16 arguments and 64 mappings keep this rule within the
    # apiserver's cost budget (with KMM's unbounded lists it would exceed it 24 times).
    value: Annotated[
        str,
        Field(max_length=512, json_schema_extra=cel_rules(_BUILD_ARG_VARIABLES_RULE)),
    ]


class KanikoParams(KubeModel):
    """KMM's builder parameters, under KMM's name; the builder is buildah now."""

    tag: Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]
    """Tag of the builder image (kmodkit's buildah builder) to run instead of the configured
    one's."""


class Build(KubeModel):
    """An in-cluster image build, used when the image does not exist yet."""

    build_args: list[BuildArg] | None = Field(default=None, max_length=MAX_BUILD_ARGS)
    """Build arguments; template variables such as ${KERNEL_FULL_VERSION} are substituted."""
    dockerfile_config_map: LocalObjectReference
    """ConfigMap whose key "dockerfile" holds the Dockerfile."""
    secrets: list[LocalObjectReference] | None = Field(default=None, max_length=64)
    """Secrets made available to the build."""
    base_image_registry_tls: RegistryTLS | None = Field(default=None, alias="baseImageRegistryTLS")
    """TLS settings for pulling the Dockerfile's base images."""
    selector: LabelSelector | None = None
    """Node selector for the build pod."""
    kaniko_params: KanikoParams | None = None
    """Builder parameters (KMM's name): the tag of the builder image, kmodkit's buildah
    builder."""


class Sign(KubeModel):
    """Module signing (KMM's): the listed files signed with a key the kernel trusts.

    The signed image is pushed as the mapping's containerImage; the unsigned one
    is ``unsignedImage`` or, with a build, what the build pushes first.
    """

    unsigned_image: Annotated[
        ImageRef | None,
        Field(json_schema_extra=cel_rules(_UNSIGNED_IMAGE_RULE, _UNSIGNED_VARIABLES_RULE)),
    ] = None
    """Image holding the unsigned modules; required unless a build makes them. With a build, the
    build pushes here (default: containerImage's tag with "-unsigned" appended)."""
    unsigned_image_registry_tls: RegistryTLS | None = Field(
        default=None, alias="unsignedImageRegistryTLS"
    )
    """Registry TLS settings for pulling the unsigned image."""
    key_secret: LocalObjectReference
    """Secret whose key "key" holds the private signing key (PEM)."""
    cert_secret: LocalObjectReference
    """Secret whose key "cert" holds the signing certificate (PEM or DER)."""
    files_to_sign: list[SignedFile] = Field(min_length=1, max_length=MAX_FILES_TO_SIGN)
    """Files in the image to sign: absolute paths under modprobe.dirName, or globs (*, ?, [...]);
    each must match at least one file."""


class KernelMapping(KubeModel):
    """Which image serves which kernels."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!(has(self.literal) && self.literal != '' "
                "&& has(self.regexp) && self.regexp != '')",
                MAPPING_BOTH_MSG,
                subject="literal",
                field_path=".literal",
            ),
            cel(
                "(has(self.literal) && self.literal != '') "
                "|| (has(self.regexp) && self.regexp != '')",
                MAPPING_NEITHER_MSG,
            ),
            _IN_TREE_RULE,
        )
    )

    literal: ShortName | None = None
    """A kernel version matched exactly."""
    regexp: (
        Annotated[
            Text,
            Field(
                json_schema_extra=cel_rules(
                    # A pattern RE2 cannot compile makes matches() fail, and admission with it.
                    cel("''.matches(self) == ''.matches(self)", REGEXP_MSG, subject="regexp")
                )
            ),
        ]
        | None
    ) = None
    """An RE2 regular expression searched for in the kernel version (use ^ and $ to anchor)."""
    container_image: Annotated[
        ImageRef, Field(json_schema_extra=cel_rules(_IMAGE_RULE, _IMAGE_VARIABLES_RULE))
    ] = ""
    """Image for these kernels; empty or unset to use the container's containerImage."""
    build: Build | None = None
    """Build settings merged over the container's."""
    sign: Sign | None = None
    """Signing settings merged over the container's."""
    registry_tls: RegistryTLS | None = Field(default=None, alias="registryTLS")
    """Registry TLS settings; replace the container's as a whole when set."""
    in_tree_modules_to_remove: list[ShortName] | None = Field(default=None, max_length=64)
    """In-tree modules to unload first; replaces the container's list when set."""
    in_tree_module_to_remove: ShortName | None = None
    """Deprecated (KMM's): one in-tree module; when set, it replaces either list."""


class ModuleLoaderContainer(KubeModel):
    """The image, kernels and modprobe settings of the module loader."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "(has(self.containerImage) && self.containerImage != '') "
                "|| self.kernelMappings.all(m, has(m.containerImage) && m.containerImage != '')",
                MAPPING_IMAGE_MSG,
                subject="kernelMappings[].containerImage",
                field_path=".kernelMappings",
            ),
            _IN_TREE_RULE,
            cel(
                "(has(self.version) && self.version != '') "
                "== (has(oldSelf.version) && oldSelf.version != '')",
                VERSION_SWITCH_MSG,
                subject="version",
                field_path=".version",
            ),
            cel(
                f"!has(self.sign) || self.sign.filesToSign.all(f, f.startsWith({_DIR_PREFIX}))",
                SIGN_DIR_MSG,
                subject="sign.filesToSign",
                field_path=".sign.filesToSign",
            ),
            cel(
                "self.kernelMappings.all(m, !has(m.sign) "
                f"|| m.sign.filesToSign.all(f, f.startsWith({_DIR_PREFIX})))",
                SIGN_DIR_MSG,
                subject="kernelMappings[].sign.filesToSign",
                field_path=".kernelMappings",
            ),
            cel(
                "self.kernelMappings.all(m, !(has(self.sign) || has(m.sign)) "
                "|| (has(m.sign) && has(m.sign.unsignedImage)) "
                "|| (has(self.sign) && has(self.sign.unsignedImage)) "
                "|| has(m.build) || has(self.build))",
                SIGN_SOURCE_MSG,
                subject="kernelMappings[].sign",
                field_path=".kernelMappings",
            ),
            cel(
                "self.kernelMappings.all(m, !(has(self.sign) || has(m.sign)) "
                "|| (has(m.containerImage) && m.containerImage != '' "
                "? !m.containerImage.contains('@') "
                ": !has(self.containerImage) || !self.containerImage.contains('@')))",
                SIGN_DIGEST_MSG,
                subject="containerImage",
                field_path=".kernelMappings",
            ),
        )
    )

    modprobe: ModprobeSpec
    device_paths: list[DeviceGlob] | None = Field(default=None, max_length=16)
    """The module's device files (globs under /dev, e.g. /dev/dri/render*): a refused
    unload names the processes holding them, which lets the loader and unloader pods
    read other processes' open files (CAP_SYS_PTRACE). Unset, it says only that the
    module is in use."""
    container_image: Annotated[
        ImageRef | None,
        Field(json_schema_extra=cel_rules(_IMAGE_RULE, _IMAGE_VARIABLES_RULE)),
    ] = None
    """Default image for kernel mappings that do not name one."""
    kernel_mappings: list[KernelMapping] = Field(min_length=1, max_length=MAX_KERNEL_MAPPINGS)
    """Kernel mappings, tried in order; the first that matches a node's kernel wins."""
    in_tree_modules_to_remove: list[ShortName] | None = Field(default=None, max_length=64)
    """In-tree modules to unload before loading this one."""
    in_tree_module_to_remove: ShortName | None = None
    """Deprecated (KMM's): one in-tree module; use inTreeModulesToRemove."""
    version: ShortName | None = None
    """Module version; enables ordered upgrades driven by node labels."""
    image_pull_policy: Literal["", "Always", "IfNotPresent", "Never"] | None = None
    """Pull policy for the module image."""
    registry_tls: RegistryTLS | None = Field(default=None, alias="registryTLS")
    """Registry TLS settings for the module image."""
    build: Build | None = None
    """Default build settings, merged with each mapping's."""
    sign: Sign | None = None
    """Default signing settings, merged with each mapping's."""


class ModuleLoader(KubeModel):
    """What is loaded on the selected nodes."""

    container: ModuleLoaderContainer
    service_account_name: ShortName | None = None
    """Service account of the loader pods."""


class RolloutPolicy(KubeModel):
    """How kmodkit rolls a change across nodes (a kmodkit extension, not in KMM)."""

    max_unavailable: Annotated[
        int | str,
        Field(
            json_schema_extra=cel_rules(
                cel(
                    f"type(self) == int ? self >= 1 : self.matches('{MAX_UNAVAILABLE_PERCENT_RE}')",
                    MAX_UNAVAILABLE_MSG,
                    subject="maxUnavailable",
                )
            )
        ),
    ] = 1
    """Nodes (a count, or a percentage of the targeted nodes) that may be updating at once."""


class ModuleSpec(KubeModel):
    """What to load, where, and how to roll it out."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("has(self.moduleLoader) || has(self.devicePlugin)", NOTHING_TO_RUN_MSG)
        )
    )

    selector: LabelSelector
    """Node labels a node must carry to get the module; {} selects every node."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=64)
    """Taints the module's pods tolerate."""
    image_repo_secret: LocalObjectReference | None = None
    """Docker-config Secret used to pull and push module images."""
    module_loader: ModuleLoader | None = None
    """The kernel module to load; without it (KMM allows that, for in-tree drivers) only the
    device plugin runs."""
    device_plugin: DevicePlugin | None = None
    """KMM's device plugin: a DaemonSet on the selected nodes where the module is ready."""
    image_rebuild_trigger_generation: int | None = Field(default=None, ge=0)
    """Change to re-check every image with its registry now, and retry failed builds at once."""
    rollout: RolloutPolicy | None = None
    """kmodkit extension: rollout policy; absent means one node at a time."""

    def pod_tolerations(self) -> list[dict[str, Any]]:
        """The Module's tolerations as every pod made for it carries them."""
        return [t.model_dump(by_alias=True, exclude_none=True) for t in self.tolerations or []]

    @property
    def loader(self) -> ModuleLoader:
        """The module loader, for code that runs only when there is one."""
        if self.module_loader is None:
            raise ValueError("spec.moduleLoader is not set")
        return self.module_loader

    def rollout_policy(self) -> RolloutPolicy:
        """The rollout policy in force, with kmodkit's defaults when none is given."""
        return self.rollout if self.rollout is not None else RolloutPolicy()


class Module(KubeModel):
    """A kernel module to load on a set of nodes."""

    api_version: Literal["kmodkit.io/v1alpha1", "kmm.sigs.x-k8s.io/v1beta1"] = API_VERSION
    kind: Literal["Module"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModuleSpec
    status: ModuleStatus | None = None
