"""The write executor: bounded in flight, throttling waited out, order kept, refusals reported.

The REST client under ``Throttle`` is a stand-in (``Answers``: canned responses, no
socket), and sleeping is recorded rather than done, so no test here depends on time.
The writes in ``WritePool`` are plain functions that count themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit.core.engine.loader_plan import LoaderPlan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.unseen_writes import UnseenWrites
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import (
    THROTTLED,
    Throttle,
    TokenBucket,
    Write,
    WritePool,
    WriteSettings,
    retry_after,
)

WAIT = 10.0


@pytest.fixture
def pool() -> Iterator[WritePool]:
    p = WritePool(4, api_message)
    yield p
    p._pool.shutdown(wait=True)


def test_no_more_than_max_in_flight_writes_run_at_once(pool: WritePool) -> None:
    gate, lock = threading.Event(), threading.Lock()
    inside, peak, entered = [0], [0], threading.Semaphore(0)

    def write() -> None:
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        entered.release()
        assert gate.wait(WAIT)
        with lock:
            inside[0] -= 1

    done = threading.Thread(target=lambda: pool.run(Write("w", write) for _ in range(40)))
    done.start()
    try:
        for _ in range(4):
            assert entered.acquire(timeout=WAIT)
        # Four are in and blocked: a fifth would be let in only by a pool wider than four.
        assert not entered.acquire(timeout=0.5)
        assert inside[0] == 4 and pool.in_flight == 4
    finally:
        gate.set()
    done.join(WAIT)
    assert peak[0] == 4 and pool.peak == 4 and pool.in_flight == 0


def test_a_refused_write_is_reported_and_the_others_still_run(pool: WritePool) -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        with lock:
            ran.append(i)
        if i == 3:
            raise ApiException(status=403, reason="Forbidden")

    results = pool.run(Write(f"creating Pod ns/p{i}", lambda i=i: write(i)) for i in range(10))
    assert sorted(ran) == list(range(10))
    assert results[3] == "creating Pod ns/p3: Forbidden"
    assert [r for i, r in enumerate(results) if i != 3] == [None] * 9


def test_a_bug_in_a_write_is_raised_after_the_batch(pool: WritePool) -> None:
    ran: list[int] = []

    def write(i: int) -> None:
        ran.append(i)
        if i == 0:
            raise KeyError("bug")

    with pytest.raises(KeyError):
        pool.run(Write("w", lambda i=i: write(i)) for i in range(5))
    assert sorted(ran) == list(range(5))


class Resp:
    def __init__(
        self, status: int, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        self.status, self.headers, self.body, self.drained = status, headers or {}, body, False

    def read(self) -> bytes:
        self.drained = True
        return self.body


class Answers:
    """Stand-in for the REST client's request: answers in turn, records each call."""

    def __init__(self, *answers: Resp) -> None:
        self.answers, self.calls = list(answers), 0

    def __call__(self, method: str, url: str, *_: Any, **__: Any) -> Resp:
        self.calls += 1
        return self.answers.pop(0)


def _throttle(**settings: Any) -> tuple[Throttle, list[float]]:
    slept: list[float] = []
    return Throttle(WriteSettings(qps=0, **settings), sleep=slept.append), slept


def test_a_429_waits_its_retry_after_and_is_sent_again() -> None:
    throttle, slept = _throttle()
    first, second = Resp(429, {"Retry-After": "2"}), Resp(429, {"Retry-After": "1"})
    inner = Answers(first, second, Resp(201))
    before = THROTTLED.labels("POST")._value.get()
    assert throttle.send(inner, "POST", "/api/v1/namespaces/x/pods").status == 201
    assert slept == [2.0, 1.0] and inner.calls == 3
    assert first.drained and second.drained
    assert THROTTLED.labels("POST")._value.get() == before + 2


def test_apf_503_with_retry_after_is_throttling_but_a_bare_503_is_an_answer() -> None:
    throttle, slept = _throttle()
    assert (
        throttle.send(Answers(Resp(503, {"Retry-After": "1"}), Resp(200)), "PATCH", "/x").status
        == 200
    )
    assert throttle.send(Answers(Resp(503)), "PATCH", "/x").status == 503
    assert slept == [1.0]


def test_a_long_retry_after_is_capped_and_the_budget_ends_the_waiting() -> None:
    throttle, slept = _throttle(max_retry_after_seconds=5, throttled_budget_seconds=12)
    always = Answers(*[Resp(429, {"Retry-After": "3600"}) for _ in range(10)])
    # The budget spent, the 429 is the answer: the write is then a failure like any other.
    assert throttle.send(always, "DELETE", "/x").status == 429
    assert slept == [5.0, 5.0, 2.0]


def test_writes_are_paced_by_the_token_bucket_and_reads_are_not() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)

    throttle = Throttle(WriteSettings(qps=10, burst=2), clock=lambda: now[0], sleep=sleep)
    ok = Answers(*[Resp(200) for _ in range(6)])
    for method in ("POST", "POST", "GET", "POST", "POST"):
        throttle.send(ok, method, "/x")
    # Two from the burst at once, the GET free, then one every 0.1 s (reserved ahead).
    assert slept == pytest.approx([0.1, 0.2])


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(qps=2, burst=3, now=0)
    assert [bucket.reserve(0) for _ in range(4)] == [0, 0, 0, 0.5]
    assert bucket.reserve(100) == 0  # refilled, but only to the burst
    assert [bucket.reserve(100) for _ in range(3)] == [0, 0, 0.5]


@pytest.mark.parametrize(
    ("status", "headers", "wait"),
    [
        (429, {"Retry-After": "4"}, 4.0),
        (429, {}, 1.0),
        (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 1.0),
        (503, {"Retry-After": "2"}, 2.0),
        (503, {}, None),
        (500, {"Retry-After": "2"}, None),
        (201, {}, None),
    ],
)
def test_retry_after(status: int, headers: dict[str, str], wait: float | None) -> None:
    assert retry_after(status, headers) == wait


# What the apiserver answers an eviction a PodDisruptionBudget blocks (trimmed).
PDB_REFUSAL = (
    b'{"kind":"Status","status":"Failure","message":"Cannot evict pod as it would violate'
    b' the pod\'s disruption budget.","reason":"TooManyRequests","details":{"causes":'
    b'[{"reason":"DisruptionBudget","message":"The disruption budget pdb-n1 needs 1 healthy'
    b' pods and has 1 currently"}]},"code":429}'
)


@pytest.mark.parametrize("headers", [{}, {"Retry-After": "10"}])
def test_an_eviction_refused_by_a_disruption_budget_is_an_answer(headers: dict[str, str]) -> None:
    assert retry_after(429, headers, PDB_REFUSAL) is None
    throttle, slept = _throttle()
    answers = Answers(Resp(429, headers, PDB_REFUSAL), Resp(201))
    assert throttle.send(answers, "POST", "/api/v1/namespaces/ns/pods/p/eviction").status == 429
    assert slept == []


class PodKube:
    """Stand-in for Kube: records pod creates and deletes; refuses creates on ``refuse``."""

    def __init__(self, refuse: str) -> None:
        self.refuse = refuse
        self.created: set[str] = set()
        self.order_broken: list[str] = []
        self.deleted: list[str] = []
        self.lock = threading.Lock()
        self.writes = WritePool(8, api_message)

    def create(self, pod: dict[str, Any]) -> None:
        node = pod["spec"]["nodeName"]
        if node == self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        with self.lock:
            self.created.add(node)

    def delete_pod(self, namespace: str, name: str) -> None:
        node = name.removeprefix("old-")
        with self.lock:
            if node not in self.created:
                self.order_broken.append(node)
            self.deleted.append(node)


def test_each_successor_pod_exists_before_its_predecessor_is_deleted() -> None:
    kube = PodKube(refuse="n7")
    shared = Shared(kube=kube, operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    controller = ModuleController(
        shared,
        ModuleControllerSettings(
            loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
            build=BuildSettings(builder_image="registry.example.com/builder:1"),
        ),
    )
    nodes = [f"n{i}" for i in range(40)]
    final = LoaderPlan(
        create=[{"metadata": {"name": f"new-{n}"}, "spec": {"nodeName": n}} for n in nodes],
        deletes_by_node={n: [f"old-{n}"] for n in nodes},
    )
    failures, cut_short = controller._apply_pods(final, {"kind": "Module"}, "ns", UnseenWrites())
    assert not cut_short
    assert failures == ["creating Pod ns/new-n7: Forbidden"]
    assert kube.order_broken == []
    # The node whose successor was refused keeps its pod; every other is swapped.
    assert sorted(kube.deleted) == sorted(n for n in nodes if n != "n7")


class LabelKube:
    """Stand-in for Kube: records node label writes and whether a node lost its label while
    another was still waiting to gain one."""

    def __init__(self, gaining: set[str]) -> None:
        self.waiting = set(gaining)
        self.early: list[str] = []
        self.lock = threading.Lock()
        self.writes = WritePool(8, api_message)

    def label_node(self, node: str, change: dict[str, str | None]) -> None:
        with self.lock:
            if any(v is None for v in change.values()) and self.waiting:
                self.early.append(node)
            self.waiting.discard(node)


def test_nodes_gaining_readiness_are_labelled_before_any_node_loses_it() -> None:
    gaining = {f"a{i}" for i in range(20)}
    kube = LabelKube(gaining)
    shared = Shared(kube=kube, operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    controller = ModuleController(
        shared,
        ModuleControllerSettings(
            loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
            build=BuildSettings(builder_image="registry.example.com/builder:1"),
        ),
    )
    key = "kmm.node.kubernetes.io/ns.m.ready"
    # Sorted by name the losing nodes would come first.
    changes = {n: {key: ""} for n in gaining} | {f"0-{i}": {key: None} for i in range(20)}
    body = {"metadata": {"namespace": "ns", "name": "m"}}
    labelled = controller._label_nodes(changes, body, UnseenWrites())
    assert (labelled.failures, labelled.landed) == ([], changes)
    assert kube.early == []
    assert kube.waiting == set()


def test_by_default_the_apiserver_paces_the_writes_and_a_rate_is_a_setting() -> None:
    """Client-side pacing is off unless asked for: the in-flight bound and Priority and
    Fairness pace the writes (a 50-a-second default capped a 1,000-node rollout at 60 s)."""
    default = WriteSettings.from_env({})
    assert default.qps == 0 and default.max_in_flight == 32
    slept: list[float] = []
    throttle = Throttle(default, clock=lambda: 0.0, sleep=slept.append)
    ok = Answers(*[Resp(201) for _ in range(500)])
    for _ in range(500):
        throttle.send(ok, "POST", "/x")
    assert slept == []
    paced = WriteSettings.from_env({"KMODKIT_WRITE_QPS": "20", "KMODKIT_WRITE_BURST": "5"})
    assert (paced.qps, paced.burst) == (20.0, 5)
