"""Node-by-node rollout of a disruptive change: cordon, gates, drain, swap, validate.

A backend calls ``reconcile`` once per policy per tick with its ``UpgradePolicy``,
the nodes the policy covers and its ``RolloutHooks``; see docs/rollout.md.
"""

from kmodkit.core.contract.hooks import Failed, Pending, RolloutHooks, Validated, Validation
from kmodkit.core.contract.policy import DeviceEviction, Drain, UpgradePolicy, WaitForCompletion
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.reconcile import reconcile
from kmodkit.core.rollout.states import State
from kmodkit.core.rollout.status import NodeRolloutStatus, RolloutStatus, RolloutSummary

__all__ = [
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
    "reconcile",
]
