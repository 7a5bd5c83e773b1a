"""What a ClusterPolicy shows when the API server refuses its objects, and when its
deletion must wait for GPU ResourceClaims.

The deletion guard lists claims through the Kubernetes client; here that list is
played by a stand-in (``monkeypatch`` on ``CustomObjectsApi.list_cluster_custom_object``)
so the unit can fail it on purpose. The real list against a real API server is in
tests/integration/test_intel_lifecycle.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from kmodkit.backends.intel_xe.deletion import hold_deletion
from kmodkit.backends.intel_xe.plan import plan, with_apply_failures
from kmodkit.core.contract.backend import ApplyFailure
from tests.unit.backends.intel_xe.test_intel_plan import (
    CLAIM,
    KMM,
    body,
    counted,
    kernel_module,
    live,
    module_of,
    objects,
    view,
)


def _conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_a_refused_module_is_an_error_and_the_policy_is_not_ready() -> None:
    policy = body(kernelModule=kernel_module())
    first = plan(policy, view(KMM))
    module = live(module_of(first), 1, 1)
    (dp,) = objects(first, "DaemonSet")
    p = plan(policy, view(KMM, owned=[module, counted(dp, 1, 1)]))
    assert p.status["errors"] == [] and _conditions(dict(p.status))["Ready"] == "True"
    refused = ApplyFailure(
        "kmm.sigs.x-k8s.io/v1beta1",
        "Module",
        "kmodkit-system",
        "gpu-policy-gpu",
        'admission webhook "vmodule.kb.io" denied the request: invalid regexp',
    )
    status = with_apply_failures(policy, p.status, [refused])
    assert status["errors"] == [
        "failed to reconcile KMM Module gpu-policy-gpu for ClusterPolicy gpu-policy: "
        'admission webhook "vmodule.kb.io" denied the request: invalid regexp'
    ]
    conditions = _conditions(status)
    assert (conditions["Ready"], conditions["Degraded"]) == ("False", "True")
    assert status["kmmStatus"] == "1/1"  # the columns are what they are


def _listing(monkeypatch: pytest.MonkeyPatch, answer: Any) -> None:
    def listed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return {"items": answer, "metadata": {}}

    monkeypatch.setattr(client.CustomObjectsApi, "list_cluster_custom_object", listed)


def _deleting(with_module: bool) -> tuple[dict[str, Any], list[Any]]:
    policy = body(kernelModule=kernel_module())
    policy["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    owned = [live(module_of(plan(policy, view(KMM))), 1, 1)] if with_module else []
    return policy, owned


def test_deletion_waits_while_a_gpu_claim_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    policy, owned = _deleting(with_module=True)
    _listing(monkeypatch, [CLAIM])
    held = hold_deletion(policy, view(KMM, owned=owned), None)
    assert held is not None
    assert held["errors"] == [
        "allocated GPU ResourceClaims blocking modules.kmm.sigs.x-k8s.io/gpu-policy-gpu deletion"
    ]
    assert held["blockingClaims"] == ["apps/inference"]
    assert _conditions(held)["Ready"] == "False"
    other = {**CLAIM, "status": {"allocation": {"devices": {"results": [{"driver": "nic.io"}]}}}}
    _listing(monkeypatch, [other])
    assert hold_deletion(policy, view(KMM, owned=owned), None) is None


def test_deletion_waits_when_the_claims_cannot_be_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    policy, owned = _deleting(with_module=False)
    _listing(monkeypatch, client.ApiException(status=403, reason="Forbidden"))
    held = hold_deletion(policy, view(KMM, owned=owned), None)
    assert held is not None
    (error,) = held["errors"]
    assert error.startswith("cannot list ResourceClaims (403 Forbidden), so the deletion waits")
    # Without DRA served there can be no claim: nothing is listed, nothing waits.
    no_dra = replace(view(KMM, owned=owned), api_groups=KMM)
    assert hold_deletion(policy, no_dra, None) is None
