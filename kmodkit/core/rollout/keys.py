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

# Per-node progress of one rollout policy, kept on the Node.
# Every key is ``rollout.kmodkit.io/<scope><suffix>``; ``scope_for`` derives
# ``<scope>`` from the policy's id so several policies can roll different things
# on the same node, and hashes it when the id does not fit a key.
ROLLOUT_PREFIX = f"rollout.{labels.KMODKIT_PREFIX}"
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
ROLLOUT_SWAP_SUFFIX = ".swap"
"""Annotation. The target whose swap the rollout is about to start; written, guarded by the
observed resourceVersion, right before the swap hook is called, and removed by the write
that takes the node out of ``swapping``."""
ROLLOUT_SUFFIXES = (
    ROLLOUT_STATE_SUFFIX,
    ROLLOUT_SINCE_SUFFIX,
    ROLLOUT_CORDON_SUFFIX,
    ROLLOUT_ATTEMPT_SUFFIX,
    ROLLOUT_TARGET_SUFFIX,
    ROLLOUT_GATES_SUFFIX,
    ROLLOUT_REASON_SUFFIX,
    ROLLOUT_MESSAGE_SUFFIX,
    ROLLOUT_SWAP_SUFFIX,
)

HOLDER_ANNOTATION = f"{ROLLOUT_PREFIX}/holder"
"""Annotation, shared by every policy. Value: the id of the one policy whose rollout
is changing the node. A node is disruptive work for one rollout at a time: a driver
drain would evict a flash Job, a driver reload would kill a flash under way."""

_SCOPE_OK = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_NOT_KEY_CHAR = re.compile(r"[^-a-z0-9.]+")
_HASH_LEN = 10
_MAX_SCOPE = labels.MAX_KEY_NAME_LENGTH - max(len(s) for s in ROLLOUT_SUFFIXES)


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
    swap: str
    holder_id: str
    """This policy's value in the node's holder annotation."""

    @classmethod
    def for_policy(cls, policy_id: str) -> RolloutKeys:
        base = f"{ROLLOUT_PREFIX}/{scope_for(policy_id)}"
        return cls(
            state=base + ROLLOUT_STATE_SUFFIX,
            since=base + ROLLOUT_SINCE_SUFFIX,
            cordon=base + ROLLOUT_CORDON_SUFFIX,
            attempt=base + ROLLOUT_ATTEMPT_SUFFIX,
            target=base + ROLLOUT_TARGET_SUFFIX,
            gates=base + ROLLOUT_GATES_SUFFIX,
            reason=base + ROLLOUT_REASON_SUFFIX,
            message=base + ROLLOUT_MESSAGE_SUFFIX,
            swap=base + ROLLOUT_SWAP_SUFFIX,
            holder_id=policy_id,
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
            self.swap,
        )
