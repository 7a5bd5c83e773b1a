"""What a plan does with a spec the apiserver admitted but kmodkit cannot use.

The CRD schema cannot check everything (a label-selector string, say). Such a
policy keeps the objects it owns unchanged, starts nothing, and says in its
Ready condition which field is wrong and how.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kmodkit.backends.tenstorrent.status_common import condition
from kmodkit.sdk import ClusterView, Obj, Plan, schema_problems


def _as_applied(obj: Obj) -> dict[str, Any]:
    """An owned object reduced to what an apply sets, so applying it again changes nothing."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            key: meta[key] for key in ("name", "namespace", "labels", "annotations") if key in meta
        },
        "spec": obj.get("spec"),
    }


def invalid_spec_plan(
    err: ValidationError,
    view: ClusterView,
    previous: Mapping[str, Any],
    generation: int | None,
    now: datetime,
) -> Plan:
    problems = "; ".join(f"spec.{p.path}: {p.message}" for p in schema_problems(err))
    status = {
        **previous,
        "observedGeneration": generation,
        "conditions": [
            condition(previous, "Ready", "False", "InvalidSpec", problems, generation, now),
            condition(
                previous,
                "Progressing",
                "False",
                "InvalidSpec",
                "nothing changes until the spec is fixed",
                generation,
                now,
            ),
        ],
    }
    return Plan(objects=[_as_applied(o) for o in view.owned], status=status)
