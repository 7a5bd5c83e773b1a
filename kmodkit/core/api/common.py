"""Small Kubernetes types the kmodkit APIs share (references, TLS, tolerations)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kmodkit.core.api.base import KubeModel, ObjectName, ShortName, cel, cel_rules

# A qualified name: an optional DNS-subdomain prefix and '/', then a name of at
# most 63 characters that starts and ends alphanumeric.
QUALIFIED_NAME_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
)
# A label value: empty, or at most 63 characters that start and end alphanumeric.
LABEL_VALUE_RE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"

TOLERATION_KEY_MSG = (
    "must be a qualified name (an optional DNS prefix and '/', then at most 63 "
    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
)
TOLERATION_EMPTY_KEY_MSG = (
    "must be Exists when key is empty (an empty key with Exists tolerates every "
    "taint); set a key or use operator Exists"
)
TOLERATION_EXISTS_VALUE_MSG = (
    "must be empty when operator is Exists; remove the value or use operator Equal"
)
TOLERATION_EQUAL_VALUE_MSG = (
    "must be a valid label value (at most 63 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit)"
)
TOLERATION_SECONDS_MSG = "only applies to effect NoExecute; set effect NoExecute or remove it"


class LocalObjectReference(KubeModel):
    """A reference to an object in the Module's namespace."""

    name: ObjectName
    """Name of the referenced object."""


class RegistryTLS(KubeModel):
    """How to talk TLS to an image registry."""

    insecure: bool = False
    """Use plain HTTP to reach the registry."""
    insecure_skip_tls_verify: bool = Field(default=False, alias="insecureSkipTLSVerify")
    """Use HTTPS but do not verify the registry's certificate."""


class Toleration(KubeModel):
    """A toleration, given to every pod kmodkit runs for the Module."""

    # Pods created from a Module inherit its tolerations, so a toleration the
    # apiserver would reject on a Pod is rejected here, before any rollout.
    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                f"!has(self.key) || self.key == '' || self.key.matches('{QUALIFIED_NAME_RE}')",
                TOLERATION_KEY_MSG,
                subject="key",
                field_path=".key",
            ),
            cel(
                "(has(self.key) && self.key != '') "
                "|| (has(self.operator) && self.operator == 'Exists')",
                TOLERATION_EMPTY_KEY_MSG,
                subject="operator",
                field_path=".operator",
            ),
            cel(
                "!has(self.operator) || self.operator != 'Exists' "
                "|| !has(self.value) || self.value == ''",
                TOLERATION_EXISTS_VALUE_MSG,
                subject="value",
                field_path=".value",
            ),
            cel(
                "(has(self.operator) && self.operator == 'Exists') || !has(self.value) "
                f"|| self.value.matches('{LABEL_VALUE_RE}')",
                TOLERATION_EQUAL_VALUE_MSG,
                subject="value",
                field_path=".value",
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                TOLERATION_SECONDS_MSG,
                subject="tolerationSeconds",
                field_path=".tolerationSeconds",
            ),
        )
    )

    key: str | None = Field(default=None, max_length=317)
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: Literal["", "Exists", "Equal"] | None = None
    """Exists or Equal (the default)."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match when operator is Equal."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches every effect."""
    toleration_seconds: int | None = None
    """How long a NoExecute taint is tolerated before eviction."""


class ObjectMeta(KubeModel):
    """The parts of Kubernetes object metadata kmodkit reads.

    Everything else the apiserver sets (uid, managedFields, ...) passes through
    untouched, so metadata alone allows unknown fields.
    """

    model_config = ConfigDict(extra="allow")

    name: ShortName | None = None
    namespace: ShortName | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
