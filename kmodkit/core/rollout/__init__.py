"""Node-by-node rollout of a disruptive change: cordon, gates, drain, swap, validate.

The runtime runs a pass (``reconcile.reconcile``) for every ``RolloutRequest`` a
backend's plan returns, with the backend's ``RolloutHooks``; see docs/rollout.md.
Backends reach the rollout's types through ``kmodkit.sdk``.
"""
