"""The ``intel.com/v1alpha1`` ClusterPolicy: field for field Intel's gpu-base-operator API.

The models are the single source of the CRD schema and of the offline
validator. Each CEL rule carries a message that starts with the field it is
about; ``kmodkit.backends.intel_xe.rules`` repeats the same checks offline (plus those
CEL cannot express: RE2 syntax, template variables, the full image-reference
grammar, the operator namespace's share of KMM's name budget) with the same
messages.

Where Intel's webhook lets through what upstream KMM rejects later (a mapping
without ``containerImage``, a policy name too long for KMM's label keys), the
rule is here, so the mistake surfaces at ``kubectl apply`` rather than as a
Module that never appears.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field

from kmodkit.sdk import (
    IMAGE_TAG_OR_DIGEST_CEL,
    LABEL_VALUE_RE,
    MAX_BUILD_ARGS,
    MAX_KERNEL_MAPPINGS,
    MAX_NAME_AND_NAMESPACE,
    SIGN_DIGEST_MSG,
    SIGN_DIR_MSG,
    SIGN_SOURCE_MSG,
    BuildArg,
    Condition,
    ImageRef,
    KubeModel,
    LabelSelector,
    LocalObjectReference,
    ObjectMeta,
    ObjectName,
    RegistryTLS,
    ShortName,
    Sign,
    Text,
    Toleration,
    cel,
    cel_rules,
)
from kmodkit.sdk import MODULE_NAME_RE as KUBE_OBJECT_NAME_RE

GROUP = "intel.com"
VERSION = "v1alpha1"
API_VERSION: Final = "intel.com/v1alpha1"
KIND: Final = "ClusterPolicy"
PLURAL = "clusterpolicies"

DEFAULT_MODULE_NAME = "xe"
MODULE_SUFFIX = "-gpu"
"""The Module a policy emits is ``<policy>-gpu``, as in Intel's operator."""
# A namespace has at least one character, so this much of KMM's 41-character
# budget is the most a policy name can ever have; the namespace in use lowers
# it further (checked by the admission policy, the offline validator and the plan).
MAX_NAME_LENGTH = MAX_NAME_AND_NAMESPACE - len(MODULE_SUFFIX) - 1

DNS_SUBDOMAIN_RE = KUBE_OBJECT_NAME_RE

PCI_ID_RE = r"^0x[0-9a-f]{4}$"
MODULE_NAME_RE = r"^[A-Za-z0-9_-]+$"
# The image-reference grammar (docker/distribution), spelt without
# backslashes so it reads the same in CEL string literals and in Python.
_PATH_COMPONENT = "[a-z0-9]+(([_.]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = "([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = f"{_DOMAIN_COMPONENT}([.]{_DOMAIN_COMPONENT})*(:[0-9]+)?"
_TAG = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = "[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
PINNED_IMAGE_RE = (
    f"^({_DOMAIN}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*(:{_TAG}(@{_DIGEST})?|@{_DIGEST})$"
)

# Messages, shared by the CEL rules and the offline validator. Each is
# prefixed with its field's path where it is reported.
IMAGE_MSG = (
    "must be an image reference with an explicit tag or digest, e.g. "
    "registry.example.com/org/image:1.0 or ...@sha256:<64 hex digits>"
)
MAPPING_IMAGE_TAG_MSG = (
    "must include an explicit tag or digest after template variables are set aside, e.g. "
    "registry.example.com/xe-oot-kmd:v1-$KERNEL_FULL_VERSION; a port is not a tag"
)
MAPPING_IMAGE_REQUIRED_MSG = (
    "is required: KMM pushes the in-cluster build to this image and loads the driver from it, "
    "and rejects a mapping without one"
)
REGEXP_REQUIRED_MSG = (
    "is required: an RE2 regular expression matched against the node's kernel version, e.g. "
    "'^7[.]0[.]0-.*-generic$'"
)
DOCKERFILE_CONFIGMAP_MSG = (
    "is required: the ConfigMap in the operator namespace whose 'dockerfile' key holds the build"
)
ORDER_SIZE_MSG = (
    "must have at least 2 entries (moduleName first, then the modules to load after it); "
    "remove the field to load moduleName alone"
)
ORDER_FIRST_MSG = "must start with kernelModule.moduleName"
ORDER_DUPLICATE_MSG = "lists a module more than once; remove the duplicate"
MODULE_NAME_MSG = "must be a kernel module name: letters, digits, '_' and '-'"
VERSION_MSG = (
    "must be a valid label value (at most 63 letters, digits, '-', '_' or '.', starting and "
    "ending with a letter or digit), because nodes are labelled with it for ordered upgrades"
)
FIRMWARE_PATH_MSG = "must be an absolute path inside the driver image, e.g. /firmware"
IDS_BOTH_MSG = "dp.allowIDs and dp.denyIDs cannot both be set; keep one of them"
PCI_ID_MSG = "must be a PCI device ID: 0x followed by 4 lowercase hex digits, e.g. 0xe20b"
OBJECT_NAME_MSG = (
    "must be a valid Kubernetes object name: lowercase letters, digits, '-' and '.', "
    "starting and ending with a letter or digit"
)
POLICY_NAME_LENGTH_MSG = (
    f"plus '{MODULE_SUFFIX}' and the operator namespace must fit in KMM's "
    f"{MAX_NAME_AND_NAMESPACE} characters, because the Module <name>{MODULE_SUFFIX} "
    "is named in node-label keys; choose a shorter name"
)


def _nonempty(field: str) -> str:
    return f"has(self.{field}) && self.{field} != ''"


def _pinned_image(subject: str) -> Any:
    """An operand image field whose CEL rule names ``subject``."""
    return Field(
        json_schema_extra=cel_rules(
            cel(f"self == '' || self.matches('{PINNED_IMAGE_RE}')", IMAGE_MSG, subject=subject)
        )
    )


AllowID = Annotated[
    str,
    Field(
        max_length=6,
        json_schema_extra=cel_rules(
            cel(f"self.matches('{PCI_ID_RE}')", PCI_ID_MSG, subject="dp.allowIDs")
        ),
    ),
]
DenyID = Annotated[
    str,
    Field(
        max_length=6,
        json_schema_extra=cel_rules(
            cel(f"self.matches('{PCI_ID_RE}')", PCI_ID_MSG, subject="dp.denyIDs")
        ),
    ),
]
LogLevel = Annotated[int, Field(ge=0, le=4)]


class SecretReference(KubeModel):
    """A Secret in the operator namespace."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                f"self.name.matches('{DNS_SUBDOMAIN_RE}')",
                OBJECT_NAME_MSG,
                subject="pullSecret.name",
                field_path=".name",
            )
        )
    )

    name: ObjectName
    """Name of the Secret."""


class HealthSpec(KubeModel):
    """GPU health monitoring; its presence turns on the DRA driver's health monitoring."""

    check_interval_seconds: int = Field(default=5, ge=1, le=3600)
    """How often XPU Manager samples GPU health."""
    core_temperature_threshold: int = Field(default=100, ge=1, le=130)
    """GPU core temperature (Celsius) from which the GPU is reported unhealthy."""
    memory_temperature_threshold: int = Field(default=100, ge=1, le=130)
    """GPU memory temperature (Celsius) from which the GPU is reported unhealthy."""


class DraSpec(KubeModel):
    """The Intel GPU DRA driver (resourceRegistration: dra)."""

    image: Annotated[ImageRef | None, _pinned_image("dra.image")] = None
    """DRA driver image; empty means the pinned default."""
    log_level: LogLevel | None = None
    """Verbosity; the higher of this and spec.logLevel applies."""
    pod_health_check: bool = True
    """gRPC startup and liveness probes on the driver pods."""
    manage_binding: bool = False
    """Let the driver bind GPUs to vfio-pci itself (--manage-binding)."""


class DevicePluginSpec(KubeModel):
    """The Intel GPU device plugin (resourceRegistration: dp)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!(has(self.allowIDs) && size(self.allowIDs) > 0 "
                "&& has(self.denyIDs) && size(self.denyIDs) > 0)",
                IDS_BOTH_MSG,
            )
        )
    )

    plugin: Annotated[ImageRef | None, _pinned_image("dp.plugin")] = None
    """Device plugin image; empty means the pinned default."""
    levelzero: Annotated[ImageRef | None, _pinned_image("dp.levelzero")] = None
    """Deprecated and ignored; kept so existing policies still apply."""
    allow_ids: list[AllowID] | None = Field(default=None, alias="allowIDs", max_length=256)
    """Only these PCI device IDs are registered."""
    deny_ids: list[DenyID] | None = Field(default=None, alias="denyIDs", max_length=256)
    """These PCI device IDs are not registered."""
    by_path_mode: Literal["single", "all", "none"] | None = None
    """Which /dev/dri/by-path links are given to containers."""
    log_level: LogLevel | None = None
    """Verbosity; the higher of this and spec.logLevel applies."""


class XpuSpec(KubeModel):
    """XPU Manager (resourceMonitoring: true)."""

    image: Annotated[ImageRef | None, _pinned_image("xpu.image")] = None
    """xpumd image; empty means the pinned default."""
    log_level: LogLevel | None = None
    """Verbosity; the higher of this and spec.logLevel applies."""
    config_map_override: Annotated[
        ObjectName | None,
        Field(
            json_schema_extra=cel_rules(
                cel(
                    f"self == '' || self.matches('{DNS_SUBDOMAIN_RE}')",
                    OBJECT_NAME_MSG,
                    subject="xpu.configMapOverride",
                )
            )
        ),
    ] = None
    """ConfigMap in the operator namespace whose config.yaml replaces the generated config."""
    monitoring_resource: Literal["i915_monitoring", "xe_monitoring", "monitoring"] = "monitoring"
    """The device-plugin monitoring resource xpumd requests in dp mode."""


class BuildSpec(KubeModel):
    """In-cluster build of the driver image, when the image is not in the registry."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.dockerfileConfigMap.name != ''",
                DOCKERFILE_CONFIGMAP_MSG,
                subject="build.dockerfileConfigMap.name",
                field_path=".dockerfileConfigMap.name",
            )
        )
    )

    dockerfile_config_map: LocalObjectReference
    """ConfigMap in the operator namespace with the Dockerfile under the key 'dockerfile'."""
    build_args: list[BuildArg] | None = Field(default=None, max_length=MAX_BUILD_ARGS)
    """Build arguments (KERNEL_FULL_VERSION is always passed)."""
    secrets: list[LocalObjectReference] | None = Field(default=None, max_length=64)
    """Secrets the build may read; not for registry credentials (use pullSecret)."""


class KernelMappingSpec(KubeModel):
    """Which driver image serves which kernels."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(_nonempty("regexp"), REGEXP_REQUIRED_MSG, subject="regexp", field_path=".regexp"),
            cel(
                "self.containerImage != ''",
                MAPPING_IMAGE_REQUIRED_MSG,
                subject="containerImage",
                field_path=".containerImage",
            ),
        )
    )

    regexp: Text
    """RE2 regular expression matched against the node's kernel version."""
    container_image: Annotated[
        ImageRef,
        Field(
            json_schema_extra=cel_rules(
                cel(
                    IMAGE_TAG_OR_DIGEST_CEL,
                    MAPPING_IMAGE_TAG_MSG,
                    subject="containerImage",
                )
            )
        ),
    ]
    """Driver image for these kernels; template variables such as $KERNEL_FULL_VERSION apply."""
    build: BuildSpec | None = None
    """Build the image in-cluster when the registry does not have it."""
    sign: Sign | None = None
    """Sign the driver's modules for Secure Boot (KMM's sign, merged over kernelModule.sign)."""
    in_tree_modules_to_remove: list[ShortName] | None = Field(default=None, max_length=64)
    """In-tree modules to unload besides moduleName, which is always unloaded."""
    registry_tls: RegistryTLS | None = Field(default=None, alias="registryTLS")
    """Registry TLS for this mapping; overrides kernelModule.registryTLS."""


_ORDER = "has(self.modulesLoadingOrder) && size(self.modulesLoadingOrder) > 0"


class KernelModuleSpec(KubeModel):
    """The out-of-tree driver, loaded through a KMM Module (or kmodkit's built-in engine)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                f"!({_ORDER}) || size(self.modulesLoadingOrder) >= 2",
                ORDER_SIZE_MSG,
                subject="kernelModule.modulesLoadingOrder",
                field_path=".modulesLoadingOrder",
            ),
            cel(
                f"!({_ORDER}) || self.modulesLoadingOrder[0] == self.moduleName",
                ORDER_FIRST_MSG,
                subject="kernelModule.modulesLoadingOrder[0]",
                field_path=".modulesLoadingOrder",
            ),
            cel(
                "!has(self.modulesLoadingOrder) || self.modulesLoadingOrder.all(m, "
                "self.modulesLoadingOrder.exists_one(o, o == m))",
                ORDER_DUPLICATE_MSG,
                subject="kernelModule.modulesLoadingOrder",
                field_path=".modulesLoadingOrder",
            ),
            # The driver image's modules are under /opt, the Module's default dirName.
            cel(
                "!has(self.sign) || self.sign.filesToSign.all(f, f.startsWith('/opt/'))",
                SIGN_DIR_MSG,
                subject="kernelModule.sign.filesToSign",
                field_path=".sign.filesToSign",
            ),
            cel(
                "self.kernelMappings.all(m, !has(m.sign) "
                "|| m.sign.filesToSign.all(f, f.startsWith('/opt/')))",
                SIGN_DIR_MSG,
                subject="kernelModule.kernelMappings[].sign.filesToSign",
                field_path=".kernelMappings",
            ),
            cel(
                "self.kernelMappings.all(m, !(has(self.sign) || has(m.sign)) "
                "|| (has(m.sign) && has(m.sign.unsignedImage)) "
                "|| (has(self.sign) && has(self.sign.unsignedImage)) || has(m.build))",
                SIGN_SOURCE_MSG,
                subject="kernelModule.kernelMappings[].sign",
                field_path=".kernelMappings",
            ),
            cel(
                "self.kernelMappings.all(m, !(has(self.sign) || has(m.sign)) "
                "|| !m.containerImage.contains('@'))",
                SIGN_DIGEST_MSG,
                subject="kernelModule.kernelMappings[].containerImage",
                field_path=".kernelMappings",
            ),
        )
    )

    module_name: Annotated[
        ShortName,
        Field(
            json_schema_extra=cel_rules(
                cel(
                    f"self.matches('{MODULE_NAME_RE}')",
                    MODULE_NAME_MSG,
                    subject="kernelModule.moduleName",
                )
            )
        ),
    ] = DEFAULT_MODULE_NAME
    """The out-of-tree module to modprobe; its in-tree namesake is unloaded first."""
    version: Annotated[
        str | None,
        Field(
            max_length=63,
            json_schema_extra=cel_rules(
                cel(
                    f"self.matches('{LABEL_VALUE_RE}')", VERSION_MSG, subject="kernelModule.version"
                )
            ),
        ),
    ] = None
    """Opts into ordered upgrades: nodes load it once labelled with this version."""
    engine: Literal["Auto", "KMM", "Builtin"] = "Auto"
    """Which engine loads the driver: KMM if installed (Auto), or force KMM or kmodkit's own."""
    kernel_mappings: list[KernelMappingSpec] = Field(min_length=1, max_length=MAX_KERNEL_MAPPINGS)
    """Kernel-to-image mappings, tried in order."""
    modules_loading_order: list[ShortName] | None = Field(default=None, max_length=64)
    """moduleName first, then the modules loaded with it; unloaded in reverse."""
    firmware_path: Annotated[
        Text | None,
        Field(
            json_schema_extra=cel_rules(
                cel(
                    "self == '' || self.startsWith('/')",
                    FIRMWARE_PATH_MSG,
                    subject="kernelModule.firmwarePath",
                )
            )
        ),
    ] = None
    """Directory in the driver image whose files are copied to the host's firmware path."""
    registry_tls: RegistryTLS | None = Field(default=None, alias="registryTLS")
    """Registry TLS for every mapping that does not set its own."""
    sign: Sign | None = None
    """Sign the driver's modules for Secure Boot (KMM's sign), for every mapping."""


class ClusterPolicySpec(KubeModel):
    """How Intel GPUs are driven and exposed on the selected nodes."""

    resource_registration: Literal["dp", "dra"]
    """Expose GPUs with the device plugin (dp) or the DRA driver (dra)."""
    resource_monitoring: bool = False
    """Run XPU Manager for telemetry and health."""
    use_nfd_labeling: bool = Field(default=False, alias="useNFDLabeling")
    """Select GPU nodes by NFD labels (and install the NFD rule that sets them)."""
    prometheus_integration: bool = False
    """Create a Service and ServiceMonitor for XPU Manager's metrics (with resourceMonitoring)."""
    health: HealthSpec | None = None
    """GPU health thresholds; its presence enables health monitoring in the DRA driver."""
    dra: DraSpec | None = None
    dp: DevicePluginSpec | None = None
    xpu: XpuSpec | None = None
    pull_secret: SecretReference | None = None
    """Registry credentials in the operator namespace, for pulls and in-cluster build pushes."""
    node_selector: LabelSelector | None = None
    """Labels GPU nodes carry (kubernetes.io/arch: amd64 is always required)."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=64)
    """Taints every component tolerates."""
    log_level: LogLevel | None = None
    """Verbosity floor for every component."""
    kernel_module: KernelModuleSpec | None = None
    """The out-of-tree driver; absent means the in-tree driver is used."""


class ClusterPolicyStatus(KubeModel):
    """What the policy's components report."""

    device_plugin_status: str | None = Field(default=None, max_length=64)
    """<ready>/<desired> device-plugin pods, or N/A."""
    dra_status: str | None = Field(default=None, max_length=64)
    """<ready>/<desired> DRA driver pods, or N/A."""
    xpu_manager_status: str | None = Field(default=None, max_length=64)
    """<ready>/<desired> XPU Manager pods, or N/A."""
    kmm_status: str | None = Field(default=None, max_length=64)
    """<available>/<desired> nodes with the driver loaded, N/A, Removing or Recreating."""
    engine: str | None = Field(default=None, max_length=64)
    """Which engine serves the driver Module: KMM, Builtin, or empty without kernelModule."""
    engine_switch: str | None = Field(default=None, max_length=1024)
    """Where a switch between engines stands; empty when none is under way."""
    errors: list[Text] | None = Field(default=None, max_length=10)
    """What keeps the policy from being fully applied, newest last."""
    blocking_claims: list[Text] | None = Field(default=None, max_length=10)
    """<namespace>/<name> of the allocated GPU ResourceClaims holding a deletion back (first 10)."""
    conditions: list[Condition] | None = Field(
        default=None,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation the status was computed from."""


class ClusterPolicy(KubeModel):
    """Intel GPU components and, optionally, the out-of-tree Xe driver, for a set of nodes."""

    api_version: Literal["intel.com/v1alpha1"] = API_VERSION
    kind: Literal["ClusterPolicy"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ClusterPolicySpec
    status: ClusterPolicyStatus | None = None
