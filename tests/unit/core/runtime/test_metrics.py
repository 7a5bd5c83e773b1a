"""The operator's metrics that the chart's alerts and dashboard read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY

from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.observed import NodeRecord, NodeView
from kmodkit.core.rollout.plan import Context, plan
from kmodkit.core.rollout.states import State
from kmodkit.core.rollout.status import summarize
from kmodkit.core.runtime import metrics


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_successful_pass_records_when_and_a_failed_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = {"controller": "unit", "policy": "ns/ok"}
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "time", lambda: now[0])
    outcomes = [RuntimeError("refused"), None]

    def one_pass() -> float | None:
        if (outcome := outcomes.pop(0)) is not None:
            raise outcome
        return None

    run = metrics.instrumented("unit", "ns/ok", one_pass)
    # Before any success: when the loop began, so a policy that never succeeds ages too.
    assert _value("kmodkit_reconcile_last_success_timestamp_seconds", **policy) == 1000.0
    now[0] = 1500.0
    with pytest.raises(RuntimeError):
        run()
    assert _value("kmodkit_reconcile_last_success_timestamp_seconds", **policy) == 1000.0
    now[0] = 2000.0
    run()
    assert _value("kmodkit_reconcile_last_success_timestamp_seconds", **policy) == 2000.0
    metrics.forget("unit", "ns/ok")
    assert _value("kmodkit_reconcile_last_success_timestamp_seconds", **policy) is None


def test_degraded_follows_the_condition_and_goes_with_the_policy() -> None:
    policy = {"controller": "unit", "policy": "ns/mod"}

    def status(degraded: str) -> dict[str, Any]:
        return {"conditions": [{"type": "Ready", "status": "True"},
                               {"type": "Degraded", "status": degraded}]}  # fmt: skip

    metrics.degraded("unit", "ns/mod", status("True"))
    assert _value("kmodkit_degraded", **policy) == 1
    metrics.degraded("unit", "ns/mod", status("False"))
    assert _value("kmodkit_degraded", **policy) == 0
    metrics.degraded("unit", "ns/mod", status("Unknown"))
    assert _value("kmodkit_degraded", **policy) == 0
    metrics.degraded("unit", "ns/mod", {})
    assert _value("kmodkit_degraded", **policy) == 0
    metrics.forget("unit", "ns/mod")
    assert _value("kmodkit_degraded", **policy) is None


def test_a_rollout_pass_reports_its_latest_node_change_and_pause() -> None:
    views = [
        NodeView(name="a", state=State.DONE, record=NodeRecord(since=1000.0)),
        NodeView(name="b", state=State.DRAINING, record=NodeRecord(since=1500.0)),
        NodeView(name="c", state=None, needs_update=False),
    ]
    ctx = Context(UpgradePolicy(), RolloutKeys.for_policy("p"), "v", 1600.0, paused=True)
    p = plan(views, ctx)
    metrics.rollout_pass("unit.rollouts", "p", summarize(views, p, p.steps))
    policy = {"controller": "unit.rollouts", "policy": "p"}
    assert _value("kmodkit_rollout_last_transition_timestamp_seconds", **policy) == 1500.0
    assert _value("kmodkit_rollout_paused", **policy) == 1
    assert _value("kmodkit_nodes", **policy, state="done") == 1
    metrics.forget("unit.rollouts", "p")
    assert _value("kmodkit_rollout_paused", **policy) is None
    assert _value("kmodkit_rollout_last_transition_timestamp_seconds", **policy) is None


def test_a_rollout_no_node_has_entered_has_no_transition_time() -> None:
    views = [NodeView(name="a", state=None, needs_update=False)]
    p = plan(views, Context(UpgradePolicy(), RolloutKeys.for_policy("q"), "v", 0.0))
    assert summarize(views, p, p.steps).last_transition is None


def test_api_requests_are_counted_by_method_and_code() -> None:
    answers: list[Any] = [SimpleNamespace(status=200), SimpleNamespace(status=409), OSError()]

    def request(method: str, url: str, **_: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    api = SimpleNamespace(rest_client=SimpleNamespace(request=request))

    def count(method: str, code: str) -> float:
        return _value("kmodkit_api_requests_total", method=method, code=code) or 0.0

    before = [count("PATCH", "200"), count("PATCH", "409"), count("GET", "error")]
    metrics.count_requests(api)
    assert api.rest_client.request("PATCH", "/api/v1/nodes/a").status == 200
    assert api.rest_client.request("PATCH", "/api/v1/nodes/a").status == 409
    with pytest.raises(OSError):
        api.rest_client.request("GET", "/api/v1/nodes", _request_timeout=5)
    after = [count("PATCH", "200"), count("PATCH", "409"), count("GET", "error")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]


def test_build_outcomes_are_series_before_any_build_finishes() -> None:
    metrics.register(kopf.OperatorRegistry())
    for outcome in ("succeeded", "failed"):
        labels = {"component": "module-build", "outcome": outcome}
        assert _value("kmodkit_jobs_finished_total", **labels) is not None


def test_a_policys_status_summary_is_a_gauge_per_count_and_goes_with_it() -> None:
    policy = {"controller": "unit.tt", "policy": "default"}
    status = {"summary": {"matched": 10000, "upToDate": 9990, "failed": 1, "inProgress": 1}}
    metrics.summary("unit.tt", "default", status)
    assert _value("kmodkit_policy_nodes", **policy, count="matched") == 10000
    assert _value("kmodkit_policy_nodes", **policy, count="upToDate") == 9990
    metrics.summary("unit.tt", "default", {"summary": {"matched": 10000, "upToDate": 10000}})
    assert _value("kmodkit_policy_nodes", **policy, count="upToDate") == 10000
    assert _value("kmodkit_policy_nodes", **policy, count="failed") is None
    metrics.summary("unit.tt", "default", {"summary": {"matched": 3, "phase": "x", "ok": True}})
    assert _value("kmodkit_policy_nodes", **policy, count="phase") is None
    assert _value("kmodkit_policy_nodes", **policy, count="ok") is None
    metrics.forget("unit.tt", "default")
    assert _value("kmodkit_policy_nodes", **policy, count="matched") is None
