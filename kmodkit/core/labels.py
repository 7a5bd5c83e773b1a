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
MODULE_VERSION = ModuleKey(KMM_PREFIX, before="version-module.")
"""Set by the admin: the version this node should run."""


class _ReadyKey(ModuleKey):
    """``<ns>.<name>.ready``, which must not claim the ``.version.ready`` keys."""

    def parse(self, key: str) -> ModuleRef | None:
        if VERSION_READY.parse(key) is not None:
            return None
        return super().parse(key)


READY = _ReadyKey(KMM_PREFIX, after=".ready")
"""Value empty: the module is loaded on the node as specified."""
DEVICE_PLUGIN_READY = ModuleKey(KMM_PREFIX, after=".device-plugin-ready")
"""Value empty: a pod of the Module's device plugin is Ready on the node."""


# Pod, DaemonSet and DeviceClass labels (KMM).
# Module annotation: deleting this Module hands its nodes to another engine, which
# already serves them; the driver and the readiness labels stay (value "true").
HANDED_OVER = f"{KMODKIT_PREFIX}/handed-over"

MODULE_NAME_LABEL = f"{KMM_PREFIX}/module.name"
ROLE_LABEL = f"{KMM_PREFIX}/role"
ROLE_MODULE_LOADER = "module-loader"
TARGET_KERNEL_LABEL = f"{KMM_PREFIX}/target-kernel"

# kmodkit's own keys.
FIELD_MANAGER = "kmodkit"
"""Field manager of kmodkit's server-side applies and patches."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kmodkit"
