"""The public API for backend authors: the only module a backend imports from kmodkit.

Everything a backend needs is here, under one stable name each: the backend
contract (what a backend declares and what a plan returns), the rollout hooks
and policy a plan may hand to the node-by-node rollout, the model and CRD
types its custom resources are built from, validation helpers, and the label
keys a backend may read or write. Every other module of kmodkit is private
and may move between releases.

The names are covered by ``CONTRACT_VERSION``: a name is only ever added
within one contract version; removing or changing one bumps it
(docs/writing-a-backend.md, "Versioning").
"""

from kmodkit.core.api.base import (
    ImageRef,
    KubeModel,
    LabelSelector,
    ObjectName,
    ShortName,
    Text,
    cel,
    cel_rules,
)
from kmodkit.core.api.common import (
    LABEL_VALUE_RE,
    QUALIFIED_NAME_RE,
    TOLERATION_EMPTY_KEY_MSG,
    TOLERATION_EQUAL_VALUE_MSG,
    TOLERATION_EXISTS_VALUE_MSG,
    TOLERATION_KEY_MSG,
    TOLERATION_SECONDS_MSG,
    LocalObjectReference,
    ObjectMeta,
    RegistryTLS,
    Toleration,
)
from kmodkit.core.api.module import API_VERSION as MODULE_API_VERSION
from kmodkit.core.api.module import (
    IMAGE_TAG_OR_DIGEST_CEL,
    KMM_API_VERSION,
    MAX_BUILD_ARGS,
    MAX_KERNEL_MAPPINGS,
    MAX_NAME_AND_NAMESPACE,
    SIGN_DIGEST_MSG,
    SIGN_DIR_MSG,
    SIGN_SOURCE_MSG,
    BuildArg,
    Sign,
)
from kmodkit.core.api.module import NAME_RE as MODULE_NAME_RE
from kmodkit.core.api.status import DEGRADED, PROGRESSING, READY, Condition
from kmodkit.core.contract.backend import (
    CONTRACT_VERSION,
    ApplyFailedFn,
    ApplyFailure,
    Backend,
    ClusterView,
    DeletionGuardFn,
    HooksFn,
    NodeEvent,
    OwnedKind,
    Plan,
    PlanFn,
    Resource,
    RolloutControls,
    RolloutRequest,
    RolloutStatusFn,
    Watch,
)
from kmodkit.core.contract.hooks import Failed, Obj, Pending, RolloutHooks, Validated, Validation
from kmodkit.core.contract.policy import DeviceEviction, Drain, UpgradePolicy, WaitForCompletion
from kmodkit.core.engine.images import (
    ImageReferenceError,
    parse_image_reference,
    require_tag_or_digest,
)
from kmodkit.core.engine.re2 import RegexpError, check_re2, compile_re2
from kmodkit.core.engine.templating import TemplateError, check_template, substitute
from kmodkit.core.kernel import TEMPLATE_VARIABLES, template_values
from kmodkit.core.labels import FIELD_MANAGER, HANDED_OVER, LabelKeyError
from kmodkit.core.labels import MODULE_VERSION as MODULE_VERSION_LABEL
from kmodkit.core.labels import READY as MODULE_READY_LABEL
from kmodkit.core.nodes import NodeView
from kmodkit.core.owners import controller_reference
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.states import State, parse_state
from kmodkit.core.rollout.status import NodeRolloutStatus, RolloutStatus, RolloutSummary
from kmodkit.core.schema.crd import CrdSource, PrinterColumn
from kmodkit.core.schema.validation import Problem, schema_problems
from kmodkit.core.selectors import selector_error

__all__ = [  # noqa: RUF022 (grouped by purpose, not sorted)
    # The backend contract.
    "CONTRACT_VERSION",
    "ApplyFailedFn",
    "ApplyFailure",
    "Backend",
    "DeletionGuardFn",
    "ClusterView",
    "HooksFn",
    "Obj",
    "OwnedKind",
    "NodeEvent",
    "Plan",
    "PlanFn",
    "Resource",
    "RolloutControls",
    "RolloutRequest",
    "RolloutStatusFn",
    "Watch",
    "controller_reference",
    # Rollouts: the policy a plan hands over, the hooks a backend implements,
    # the per-node state and status the rollout reports.
    "DeviceEviction",
    "Drain",
    "Failed",
    "NodeRolloutStatus",
    "Pending",
    "RolloutHooks",
    "RolloutKeys",
    "RolloutStatus",
    "RolloutSummary",
    "State",
    "UpgradePolicy",
    "Validated",
    "Validation",
    "WaitForCompletion",
    "parse_state",
    # Models and CRDs of a backend's own resources.
    "Condition",
    "CrdSource",
    "ImageRef",
    "KubeModel",
    "LabelSelector",
    "LocalObjectReference",
    "ObjectMeta",
    "ObjectName",
    "PrinterColumn",
    "RegistryTLS",
    "ShortName",
    "Text",
    "Toleration",
    "cel",
    "cel_rules",
    "DEGRADED",
    "PROGRESSING",
    "READY",
    # The Module a backend may emit (kmodkit's engine or upstream KMM).
    "BuildArg",
    "Sign",
    "SIGN_DIGEST_MSG",
    "SIGN_DIR_MSG",
    "SIGN_SOURCE_MSG",
    "IMAGE_TAG_OR_DIGEST_CEL",
    "KMM_API_VERSION",
    "MAX_BUILD_ARGS",
    "MAX_KERNEL_MAPPINGS",
    "MAX_NAME_AND_NAMESPACE",
    "MODULE_API_VERSION",
    "MODULE_NAME_RE",
    # Validation helpers, with the same messages as the core's own checks.
    "LABEL_VALUE_RE",
    "QUALIFIED_NAME_RE",
    "TOLERATION_EMPTY_KEY_MSG",
    "TOLERATION_EQUAL_VALUE_MSG",
    "TOLERATION_EXISTS_VALUE_MSG",
    "TOLERATION_KEY_MSG",
    "TOLERATION_SECONDS_MSG",
    "ImageReferenceError",
    "Problem",
    "RegexpError",
    "TEMPLATE_VARIABLES",
    "TemplateError",
    "check_re2",
    "check_template",
    "compile_re2",
    "parse_image_reference",
    "require_tag_or_digest",
    "schema_problems",
    "selector_error",
    "substitute",
    "template_values",
    # Cluster facts and label keys.
    "FIELD_MANAGER",
    "LabelKeyError",
    "HANDED_OVER",
    "MODULE_READY_LABEL",
    "MODULE_VERSION_LABEL",
    "NodeView",
]
