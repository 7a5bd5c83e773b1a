"""The node label and annotation keys of one rollout policy.

Several policies (a driver and a firmware policy, say) may roll different things
across the same node at once, so every key embeds a scope derived from the
policy's id. A key's name part is at most 63 characters; an id that is too long,
or that holds characters a key may not, is shortened and suffixed with a hash of
the whole id so two ids never share keys.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from kmodkit.core import labels

_SCOPE_OK = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_NOT_KEY_CHAR = re.compile(r"[^-a-z0-9.]+")
_HASH_LEN = 10
_MAX_SCOPE = labels.MAX_KEY_NAME_LENGTH - max(len(s) for s in labels.ROLLOUT_SUFFIXES)


def scope_for(policy_id: str) -> str:
    """The key scope of a policy: its id when that fits, else a readable prefix plus a hash."""
    if len(policy_id) <= _MAX_SCOPE and _SCOPE_OK.match(policy_id):
        return policy_id
    digest = hashlib.sha256(policy_id.encode()).hexdigest()[:_HASH_LEN]
    readable = _NOT_KEY_CHAR.sub("-", policy_id.lower()).strip("-.")
    readable = readable[: _MAX_SCOPE - _HASH_LEN - 1].rstrip("-.")
    return f"{readable}-{digest}" if readable else digest


@dataclass(frozen=True)
class RolloutKeys:
    """Every key one policy reads and writes on a node."""

    state: str
    since: str
    cordon: str
    attempt: str
    target: str
    gates: str
    reason: str
    message: str

    @classmethod
    def for_policy(cls, policy_id: str) -> RolloutKeys:
        base = f"{labels.ROLLOUT_PREFIX}/{scope_for(policy_id)}"
        return cls(
            state=base + labels.ROLLOUT_STATE_SUFFIX,
            since=base + labels.ROLLOUT_SINCE_SUFFIX,
            cordon=base + labels.ROLLOUT_CORDON_SUFFIX,
            attempt=base + labels.ROLLOUT_ATTEMPT_SUFFIX,
            target=base + labels.ROLLOUT_TARGET_SUFFIX,
            gates=base + labels.ROLLOUT_GATES_SUFFIX,
            reason=base + labels.ROLLOUT_REASON_SUFFIX,
            message=base + labels.ROLLOUT_MESSAGE_SUFFIX,
        )

    def annotations(self) -> tuple[str, ...]:
        """The annotation keys (everything but the state label)."""
        return (
            self.since,
            self.cordon,
            self.attempt,
            self.target,
            self.gates,
            self.reason,
            self.message,
        )
