"""Deleting a ClusterPolicy waits while GPU ResourceClaims are allocated.

Deleting the policy garbage-collects its Module (the engine then unloads the
driver) and its DRA driver: the same outage the in-pass guard prevents for a
removed ``kernelModule``. So the policy keeps a finalizer until no claim has a
device from ``gpu.intel.com``. The claims are listed afresh, and a list that
fails counts as claims present: a guard that lets go when it cannot look is
no guard. (Kubernetes' foreground cascading deletion removes dependents before
any finalizer is asked; the guard holds the default, background deletion.)
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from kmodkit.backends.intel_xe.api import GROUP
from kmodkit.backends.intel_xe.claims import CLAIMS, allocated_gpu_claims
from kmodkit.backends.intel_xe.module_lifecycle import BLOCKING, live_modules, reference
from kmodkit.backends.intel_xe.plan import COLUMNS
from kmodkit.backends.intel_xe.status import MAX_BLOCKING_CLAIMS, bounded, conditions, progress
from kmodkit.sdk import ClusterView, Obj

_PAGE = 500


def hold_deletion(body: Obj, view: ClusterView, api: Any) -> dict[str, Any] | None:
    """The status to show while the policy's deletion must wait, or None to let it go."""
    try:
        claims = allocated_gpu_claims(_claims(api)) if CLAIMS.group in view.api_groups else []
    except client.ApiException as err:
        return _held(
            body,
            [
                f"cannot list ResourceClaims ({err.status} {err.reason}), so the deletion waits: "
                "allocated GPU ResourceClaims may exist; grant the operator list on "
                "resourceclaims.resource.k8s.io or check the API server"
            ],
            [],
        )
    if not claims:
        return None
    modules = live_modules(view.owned)
    name = (body.get("metadata") or {}).get("name", "")
    what = reference(modules[0]) if modules else f"clusterpolicies.{GROUP}/{name}"
    return _held(body, [f"{BLOCKING} {what} deletion"], claims)


def _claims(api: Any) -> Iterator[Obj]:
    objects: Any = client.CustomObjectsApi(api)  # its methods have no useful types
    token = None
    while True:
        page = objects.list_cluster_custom_object(
            CLAIMS.group, CLAIMS.version, CLAIMS.plural, limit=_PAGE, _continue=token
        )
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def _held(body: Obj, errors: list[str], claims: list[str]) -> dict[str, Any]:
    old = dict(body.get("status") or {})
    shown = bounded(errors)
    columns = [str(old.get(c, "")) for c in COLUMNS]
    generation = (body.get("metadata") or {}).get("generation")
    return {
        **old,
        "errors": shown,
        "blockingClaims": claims[:MAX_BLOCKING_CLAIMS],
        "conditions": conditions(old, generation, progress(columns), shown, datetime.now(UTC)),
    }
