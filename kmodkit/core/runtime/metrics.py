"""Prometheus metrics of the operator, served on their own port (``/metrics``).

Cardinality is bounded by design: labels name a controller (``modules`` or
``<backend>.<plural>``), a policy object, a state or an outcome, never a node,
so a 10,000-node fleet yields the same number of series as a 3-node one.
Per-node detail lives in each object's status and on the nodes themselves.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from kmodkit.core import labels
from kmodkit.core.api.status import DEGRADED
from kmodkit.core.engine.build_plan import BUILD_COMPONENT
from kmodkit.core.rollout.status import RolloutStatus

RECONCILES = Counter(
    "kmodkit_reconcile",
    "Reconcile passes, by controller and result (ok or error).",
    ["controller", "result"],
)
RECONCILE_SECONDS = Histogram(
    "kmodkit_reconcile_duration_seconds",
    "Time one reconcile pass took, by controller.",
    ["controller"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LAST_SUCCESS = Gauge(
    "kmodkit_reconcile_last_success_timestamp_seconds",
    "When a pass over the policy last finished without an error, or, before the first, "
    "when the operator began serving it (Unix time).",
    ["controller", "policy"],
)
DEGRADED_POLICY = Gauge(
    "kmodkit_degraded",
    "1 while the policy's status holds Degraded=True (the condition's reason says why).",
    ["controller", "policy"],
)
NODES = Gauge(
    "kmodkit_nodes",
    "Nodes a policy covers, by state (a Module's node phase, or a rollout state).",
    ["controller", "policy", "state"],
)
POLICY_NODES = Gauge(
    "kmodkit_policy_nodes",
    "A policy's node counts as its status.summary has them (matched, upToDate, inProgress, "
    "failed, pending, ...), by count.",
    ["controller", "policy", "count"],
)
TRANSITIONS = Counter(
    "kmodkit_rollout_transitions",
    "Rollout transitions into each state (done and failed are the outcomes of a node's "
    "driver swap or firmware flash).",
    ["controller", "state"],
)
EVICTIONS = Counter(
    "kmodkit_rollout_evictions",
    "Eviction requests sent by rollouts, by result (sent or blocked by a PodDisruptionBudget).",
    ["controller", "result"],
)
LAST_TRANSITION = Gauge(
    "kmodkit_rollout_last_transition_timestamp_seconds",
    "When a node of the policy's rollout last changed state (Unix time, as recorded on "
    "the nodes, so it survives a restart).",
    ["controller", "policy"],
)
PAUSED = Gauge(
    "kmodkit_rollout_paused",
    "1 while the policy's rollout is paused (no new node starts).",
    ["controller", "policy"],
)
JOBS = Counter(
    "kmodkit_jobs_finished",
    "Jobs kmodkit started (builds, flashes) that finished, by component and outcome.",
    ["component", "outcome"],
)
JOB_SECONDS = Histogram(
    "kmodkit_job_duration_seconds",
    "Start to finish of the Jobs counted in kmodkit_jobs_finished.",
    ["component", "outcome"],
    buckets=(30, 60, 120, 300, 600, 900, 1800, 3600, 7200),
)

API_REQUESTS = Counter(
    "kmodkit_api_requests",
    "Requests to the Kubernetes API from kmodkit's own client, by HTTP method and status "
    "code (error: no answer). kopf's watches and bookkeeping are not counted.",
    ["method", "code"],
)

COMPONENT_LABEL = "app.kubernetes.io/component"
_POLICY_GAUGES = (LAST_SUCCESS, DEGRADED_POLICY, LAST_TRANSITION, PAUSED)

_lock = threading.Lock()
_states: dict[tuple[str, str], set[str]] = {}
_summaries: dict[tuple[str, str], set[str]] = {}
_counted_jobs: set[str] = set()
_started = time.time()


def serve(port: int, host: str) -> None:
    """Serve ``/metrics`` from a daemon thread (``port`` 0 disables it)."""
    if port:
        start_http_server(port, addr=host)


def register(registry: kopf.OperatorRegistry) -> None:
    """Observe kmodkit's Jobs (builds, flashes) finishing; rides on the engine's Job watch."""
    # Builds' series exist from the start, so the first failure is an increase (a
    # series born at 1 shows none to rate() and increase()).
    for outcome in ("succeeded", "failed"):
        JOBS.labels(BUILD_COMPONENT, outcome)

    @kopf.on.event(
        "batch",
        "v1",
        "jobs",
        id="metrics.jobs",
        labels={labels.MANAGED_BY_LABEL: labels.MANAGED_BY},
        registry=registry,
    )
    async def job_changed(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            job_gone(body)
        else:
            component = (body.get("metadata") or {}).get("labels", {}).get(COMPONENT_LABEL, "")
            job_seen(body, component or "unknown")


def count_requests(api: Any) -> None:
    """Count every request ``api`` (a kubernetes ``ApiClient``) sends.

    Its REST client is the one door the controllers, rollouts and the dynamic
    client all go through, so one wrapper there sees every read and write.
    """
    rest = api.rest_client
    send = rest.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        try:
            response = send(method, url, *args, **kwargs)
        except Exception:
            API_REQUESTS.labels(method, "error").inc()
            raise
        API_REQUESTS.labels(method, str(response.status)).inc()
        return response

    rest.request = request


def instrumented(
    controller: str, policy: str, one_pass: Callable[[], float | None]
) -> Callable[[], Any]:
    """``one_pass`` counted and timed; exceptions are counted and re-raised."""
    # A policy whose passes fail from the start must age as well.
    LAST_SUCCESS.labels(controller, policy).set_to_current_time()

    def run() -> float | None:
        started = time.monotonic()
        try:
            result = one_pass()
        except Exception:
            RECONCILES.labels(controller, "error").inc()
            raise
        finally:
            RECONCILE_SECONDS.labels(controller).observe(time.monotonic() - started)
        RECONCILES.labels(controller, "ok").inc()
        LAST_SUCCESS.labels(controller, policy).set_to_current_time()
        return result

    return run


def node_states(controller: str, policy: str, counts: Mapping[str, int]) -> None:
    """Set the per-state node counts of one policy; states no longer seen are dropped."""
    with _lock:
        before = _states.get((controller, policy), set())
        for state in before - set(counts):
            NODES.remove(controller, policy, state)
        for state, n in counts.items():
            NODES.labels(controller, policy, state).set(n)
        _states[(controller, policy)] = set(counts)


def summary(controller: str, policy: str, status: Mapping[str, Any]) -> None:
    """Set the counts of the status about to be written (``status.summary``'s integers);
    counts no longer there are dropped."""
    counts = {
        name: n
        for name, n in (status.get("summary") or {}).items()
        if isinstance(n, int) and not isinstance(n, bool)
    }
    with _lock:
        for name in _summaries.get((controller, policy), set()) - set(counts):
            POLICY_NODES.remove(controller, policy, name)
        for name, n in counts.items():
            POLICY_NODES.labels(controller, policy, name).set(n)
        _summaries[(controller, policy)] = set(counts)


def forget(controller: str, policy: str) -> None:
    """Drop a deleted policy's series."""
    node_states(controller, policy, {})
    summary(controller, policy, {})
    with _lock:
        _states.pop((controller, policy), None)
        _summaries.pop((controller, policy), None)
    for gauge in _POLICY_GAUGES:
        with contextlib.suppress(KeyError):  # never set here (a Module has no rollout)
            gauge.remove(controller, policy)


def degraded(controller: str, policy: str, status: Mapping[str, Any]) -> None:
    """Record whether the status about to be written holds Degraded=True."""
    is_degraded = any(
        c.get("type") == DEGRADED and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    DEGRADED_POLICY.labels(controller, policy).set(int(is_degraded))


def rollout_pass(controller: str, policy: str, result: RolloutStatus) -> None:
    node_states(controller, policy, result.nodes_by_state)
    for state, n in result.transitions.items():
        TRANSITIONS.labels(controller, state).inc(n)
    if result.evictions:
        EVICTIONS.labels(controller, "sent").inc(result.evictions)
    if result.evictions_blocked:
        EVICTIONS.labels(controller, "blocked").inc(result.evictions_blocked)
    if result.last_transition is not None:
        LAST_TRANSITION.labels(controller, policy).set(result.last_transition)
    PAUSED.labels(controller, policy).set(int(result.paused))


def job_seen(body: Mapping[str, Any], component: str) -> None:
    """Count a Job once, when it has finished after this process started.

    Jobs that finished before a restart were counted by the previous process
    (counters restart at zero with the process, as Prometheus expects).
    """
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    done = {
        c.get("type"): c
        for c in status.get("conditions") or []
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
    }
    uid = str(meta.get("uid", ""))
    if not done or not uid:
        return
    outcome, cond = next(iter(done.items()))
    finished = _timestamp(status.get("completionTime") or cond.get("lastTransitionTime"))
    if finished is None or finished < _started:
        return
    with _lock:
        if uid in _counted_jobs:
            return
        _counted_jobs.add(uid)
    outcome = "succeeded" if outcome == "Complete" else "failed"
    JOBS.labels(component, outcome).inc()
    began = _timestamp(status.get("startTime"))
    if began is not None:
        JOB_SECONDS.labels(component, outcome).observe(max(0.0, finished - began))


def job_gone(body: Mapping[str, Any]) -> None:
    with _lock:
        _counted_jobs.discard(str((body.get("metadata") or {}).get("uid", "")))


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
