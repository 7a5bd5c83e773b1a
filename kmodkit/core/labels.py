"""Every label, annotation and finalizer key kmodkit reads or writes.

The ``kmm.*`` keys follow upstream KMM's node-label protocol exactly, so an
admin's ``kubectl label node ... kmm.node.kubernetes.io/version-module.<ns>.<name>=v2``
and a device plugin selecting on ``<ns>.<name>.ready`` work as they do with KMM.
kmodkit's own keys live under ``kmodkit.io``.

Keys that embed a Module are ``<ns>.<name>`` plus fixed text. A namespace is a
DNS label and has no dots, so parsing splits at the first dot; KMM splits at
the last, which misreads Module names that contain dots.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KMM_PREFIX = "kmm.node.kubernetes.io"
KMM_BETA_PREFIX = "beta.kmm.node.kubernetes.io"
KMODKIT_PREFIX = "kmodkit.io"

# The part of a label key after the '/' is at most 63 characters.
MAX_KEY_NAME_LENGTH = 63

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class LabelKeyError(ValueError):
    """A Module whose namespace and name do not fit in a label key."""


@dataclass(frozen=True)
class ModuleRef:
    """A Module named in a label key."""

    namespace: str
    name: str


@dataclass(frozen=True)
class ModuleKey:
    """A family of label keys ``<prefix>/<before><ns>.<name><after>``."""

    prefix: str
    before: str = ""
    after: str = ""

    def key(self, namespace: str, name: str) -> str:
        """The key for one Module; raises LabelKeyError if it would be too long."""
        key_name = f"{self.before}{namespace}.{name}{self.after}"
        if len(key_name) > MAX_KEY_NAME_LENGTH:
            raise LabelKeyError(
                f"label key {self.prefix}/{key_name} is longer than {MAX_KEY_NAME_LENGTH} "
                "characters after the '/'; shorten the Module's name or namespace"
            )
        return f"{self.prefix}/{key_name}"

    def parse(self, key: str) -> ModuleRef | None:
        """The Module a key of this family names, or None if it is not one."""
        head = f"{self.prefix}/{self.before}"
        if not key.startswith(head) or not key.endswith(self.after):
            return None
        middle = key[len(head) : len(key) - len(self.after)]
        namespace, dot, name = middle.partition(".")
        if not dot or not _NAMESPACE.match(namespace) or not _NAME.match(name):
            return None
        return ModuleRef(namespace=namespace, name=name)


# Node labels (KMM).
VERSION_READY = ModuleKey(KMM_PREFIX, after=".version.ready")
"""Value: the module version loaded on the node."""
DEVICE_PLUGIN_READY = ModuleKey(KMM_PREFIX, after=".device-plugin-ready")
DRA_READY = ModuleKey(KMM_PREFIX, after=".dra-ready")
DEVICE_PLUGIN_TARGET = ModuleKey(KMM_PREFIX, after=".device-plugin-target")
MODULE_VERSION = ModuleKey(KMM_PREFIX, before="version-module.")
"""Set by the admin: the version this node should run."""
WORKER_POD_VERSION = ModuleKey(KMM_BETA_PREFIX, before="version-worker-pod.")
"""Set by the version controller: the version the loader may run on this node."""
SCHEDULE_POD_VERSION = ModuleKey(KMM_BETA_PREFIX, before="version-schedule-pod.")
"""Set by the version controller: selects the device-plugin pods of a version."""
# NodeModulesConfig labels (KMM).
MODULE_CONFIGURED = ModuleKey(KMM_BETA_PREFIX, after=".module-configured")
MODULE_IN_USE = ModuleKey(KMM_BETA_PREFIX, after=".module-in-use")


class _ReadyKey(ModuleKey):
    """``<ns>.<name>.ready``, which must not claim the ``.version.ready`` keys."""

    def parse(self, key: str) -> ModuleRef | None:
        if VERSION_READY.parse(key) is not None:
            return None
        return super().parse(key)


READY = _ReadyKey(KMM_PREFIX, after=".ready")
"""Value empty: the module is loaded on the node as specified."""


def deprecated_ready_label(name: str) -> str:
    """KMM v1's ``<name>.ready`` node label, removed wherever it is found."""
    return f"{KMM_PREFIX}/{name}.ready"


# Pod, DaemonSet and DeviceClass labels (KMM).
MODULE_NAME_LABEL = f"{KMM_PREFIX}/module.name"
MODULE_NAMESPACE_LABEL = f"{KMM_PREFIX}/module.namespace"
ROLE_LABEL = f"{KMM_PREFIX}/role"
ROLE_MODULE_LOADER = "module-loader"
ROLE_DEVICE_PLUGIN = "device-plugin"
ROLE_DRA = "dra"
WORKER_ACTION_LABEL = f"{KMM_PREFIX}/worker-action"
RESOURCE_TYPE_LABEL = f"{KMM_PREFIX}/resource-type"
TARGET_KERNEL_LABEL = f"{KMM_PREFIX}/target-kernel"
IMAGE_OWNER_LABEL = f"{KMM_PREFIX}/image-owner"
PULL_POD_TYPE_LABEL = f"{KMM_PREFIX}/pull-pod-type"
# Namespace label; note k8s.io, not kubernetes.io, as in KMM.
NAMESPACE_CONTAINS_MODULES_LABEL = "kmm.node.k8s.io/contains-modules"

# Finalizers (KMM).
KMM_MODULE_FINALIZER = f"{KMM_PREFIX}/module-finalizer"
NODE_LABELER_FINALIZER = f"{KMM_PREFIX}/node-labeler"
GC_DELAY_FINALIZER = f"{KMM_PREFIX}/gc-delay"
JOB_EVENT_FINALIZER = f"{KMM_PREFIX}/job-event-finalizer"
WORKER_POD_FINALIZER = f"{KMM_PREFIX}/nodemodulesconfig-reconciler"

# Annotations (KMM).
LAST_HASH_ANNOTATION = f"{KMM_PREFIX}/last-hash"
CREATED_EVENT_SENT_ANNOTATION = f"{KMM_PREFIX}/created-event-sent"

# kmodkit's own keys.
FIELD_MANAGER = "kmodkit"
"""Field manager of kmodkit's server-side applies and patches."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kmodkit"
MODULE_FINALIZER = f"{KMODKIT_PREFIX}/module-finalizer"
"""Finalizer on kmodkit Modules: held until the module is unloaded everywhere."""


def kmodkit_module_key(after: str) -> ModuleKey:
    """A kmodkit key family ``kmodkit.io/<ns>.<name><after>`` for per-Module node state.

    ``after`` must stay within 21 characters so every Module KMM's name rule
    admits (namespace and name together at most 41) still fits in a key.
    """
    if len(after) > MAX_KEY_NAME_LENGTH - 42:
        raise LabelKeyError(f"suffix {after!r} leaves no room for <namespace>.<name>")
    return ModuleKey(KMODKIT_PREFIX, after=after)


# Rollout (kmodkit.core.rollout): per-node progress of one rollout policy, kept on the Node.
# Every key is ``rollout.kmodkit.io/<scope><suffix>``; kmodkit.core.rollout.keys derives
# ``<scope>`` from the policy's id so several policies can roll different things
# on the same node, and hashes it when the id does not fit a key.
ROLLOUT_PREFIX = f"rollout.{KMODKIT_PREFIX}"
ROLLOUT_STATE_SUFFIX = ""
"""Label. Value: the node's rollout state (``required``, ``cordoning``, ..., ``done``)."""
ROLLOUT_SINCE_SUFFIX = ".since"
"""Annotation. Unix seconds when the node entered its current state; drives every timeout."""
ROLLOUT_CORDON_SUFFIX = ".cordon"
"""Annotation. ``rollout`` if the rollout cordoned the node, ``external`` if it already was."""
ROLLOUT_ATTEMPT_SUFFIX = ".attempt"
"""Annotation. How many times the rollout has started on this node for the current target."""
ROLLOUT_TARGET_SUFFIX = ".target"
"""Annotation. What the rollout was delivering when it started on this node."""
ROLLOUT_GATES_SUFFIX = ".gates"
"""Annotation. JSON of the deploy-gate labels' values before the rollout changed them."""
ROLLOUT_REASON_SUFFIX = ".reason"
"""Annotation. Machine-readable reason of the last transition (``EvictionBlocked``, ...)."""
ROLLOUT_MESSAGE_SUFFIX = ".message"
"""Annotation. Human-readable detail of the last transition."""
ROLLOUT_SUFFIXES = (
    ROLLOUT_STATE_SUFFIX,
    ROLLOUT_SINCE_SUFFIX,
    ROLLOUT_CORDON_SUFFIX,
    ROLLOUT_ATTEMPT_SUFFIX,
    ROLLOUT_TARGET_SUFFIX,
    ROLLOUT_GATES_SUFFIX,
    ROLLOUT_REASON_SUFFIX,
    ROLLOUT_MESSAGE_SUFFIX,
)
