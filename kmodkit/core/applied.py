"""Whether an object already holds what a server-side apply of a planned body would set.

A backend's pass plans its owned objects (a DaemonSet, a ConfigMap) whole every time.
Applying them again when nothing changed is a no-op for the object, but still a write
request the apiserver decodes, merges and audits, every pass of every policy. The
cached object says whether it is needed, given two things:

- the body is stamped with a hash of itself (``APPLIED``): a key the plan stops setting
  (a label, a ConfigMap entry) still sits on the object, where only an apply removes it,
  but the stamp differs, so it is applied;
- every field the stamped body sets holds the same value on the object: a field someone
  else changed is applied back. Fields the apiserver defaults or others own are not
  compared, as an apply leaves them alone. A field the body sets to an empty or zero value
  (``args: []``, ``tolerations: []``) is stored without it by the apiserver, so absent
  holds it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kmodkit.core.labels import KMODKIT_PREFIX

APPLIED = f"{KMODKIT_PREFIX}/applied"
"""Annotation: a hash of the body last applied (without this annotation)."""


def stamped(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with its hash in the ``APPLIED`` annotation."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED: digest}
    return {**body, "metadata": meta}


def holds(live: Any, desired: Any) -> bool:
    """Every value ``desired`` sets is in ``live``: map keys recursively (``live`` may
    have more; a key ``desired`` sets to an empty or zero value may be absent), lists
    item by item and of the same length, anything else equal."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            holds(live[k], v) if k in live else _omitted(v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(holds(a, b) for a, b in zip(live, desired, strict=True))
        )
    return type(live) is type(desired) and bool(live == desired)


def _omitted(value: Any) -> bool:
    """Whether the apiserver stores a field set to ``value`` as no field at all (Go's
    ``omitempty``: null, an empty list, map or string, zero, false)."""
    return value is None or (not value and isinstance(value, (list, dict, str, int, float)))
