"""When the real operator last passed over an object, read from its metrics."""

from __future__ import annotations

import re
import time

from kmodkit_dev.operator import Operator


def last_pass(op: Operator, controller: str, policy: str) -> float:
    """When the operator's last pass over ``policy`` ended well (0 before any did)."""
    series = (
        rf'^kmodkit_reconcile_last_success_timestamp_seconds\{{controller="{re.escape(controller)}",'
        rf'policy="{re.escape(policy)}"\}} (\S+)$'
    )
    found = re.search(series, op.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def settled(op: Operator, controller: str, policy: str, quiet: float = 3.0) -> float:
    """The last pass over ``policy`` once none came for ``quiet`` seconds."""
    last = last_pass(op, controller, policy)
    while True:
        time.sleep(quiet)
        now = last_pass(op, controller, policy)
        if now == last:
            return now
        last = now
