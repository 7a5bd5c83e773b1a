"""Bounded, throttling-aware API writes.

Two pieces, both shared by the whole process:

- ``Throttle`` sits in the ApiClient's REST client (the one door every call goes
  through): writes take a token from a client-side rate limiter (QPS + burst), and
  an answer that says "throttled" — 429, or 503 with Retry-After, as API Priority
  and Fairness sends them — is waited out (Retry-After, bounded) and sent again.
  Throttling is the apiserver pacing us, not a refusal: nothing is logged per
  write and nothing is reported failed unless the wait budget runs out.
- ``WritePool`` runs a pass's independent writes with at most N in flight. What
  must be ordered (a successor loader pod before its predecessor's deletion) the
  caller orders, by handing the pool one batch after another.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Gauge

log = logging.getLogger("kmodkit.writes")

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DISRUPTION_BUDGET_CAUSE = b'"DisruptionBudget"'
"""The cause an eviction's 429 names when a PodDisruptionBudget refused it."""
DEFAULT_RETRY_AFTER = 1.0
"""What a 429 without a usable Retry-After is waited (APF always sends one)."""

IN_FLIGHT = Gauge("kmodkit_api_writes_in_flight", "Writes of the engine's passes in flight now.")
IN_FLIGHT_MAX = Gauge(
    "kmodkit_api_writes_in_flight_max", "The most writes of the engine's passes ever in flight."
)
THROTTLED = Counter(
    "kmodkit_api_throttled",
    "Requests the apiserver throttled (429, or 503 with Retry-After) and that were sent "
    "again after its Retry-After, by method.",
    ["method"],
)


@dataclass(frozen=True)
class WriteSettings:
    max_in_flight: int = 32
    """Writes of the engine's passes in flight at once, across all passes."""
    qps: float = 0.0
    """Client-side write rate (requests per second, sustained); 0, the default, leaves the
    pacing to the apiserver's Priority and Fairness and the in-flight bound."""
    burst: int = 100
    """Writes allowed at once above the sustained rate, after a quiet spell."""
    max_retry_after_seconds: float = 30.0
    """The longest one Retry-After is honoured; a longer one is waited this long."""
    throttled_budget_seconds: float = 300.0
    """How long one request may be throttled in all before it is a failure."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> WriteSettings:
        return cls(
            max_in_flight=max(1, int(env.get("KMODKIT_WRITE_CONCURRENCY", "32"))),
            qps=max(0.0, float(env.get("KMODKIT_WRITE_QPS", "0"))),
            burst=max(1, int(env.get("KMODKIT_WRITE_BURST", "100"))),
        )


def retry_after(status: int, headers: Mapping[str, str] | None, body: bytes = b"") -> float | None:
    """Seconds to wait before sending again, if the answer means "throttled"; else None.

    APF rejects with 429 and Retry-After; an overloaded or starting apiserver may
    answer 503 with Retry-After. A 503 without it is an outage, not pacing. An
    eviction a PodDisruptionBudget refuses is a 429 too, but an answer: the
    rollout reports the node as blocked rather than wait on it here.
    """
    if status == 429 and DISRUPTION_BUDGET_CAUSE in body:
        return None
    raw = (headers or {}).get("Retry-After")
    try:
        seconds: float | None = max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        seconds = None  # an HTTP date: not sent by the apiserver
    if status == 429:
        return DEFAULT_RETRY_AFTER if seconds is None else seconds
    if status == 503 and raw is not None:
        return DEFAULT_RETRY_AFTER if seconds is None else seconds
    return None


class TokenBucket:
    """A token bucket that hands out reservations: each take returns how long its
    caller must wait, so waiting happens outside any lock."""

    def __init__(self, qps: float, burst: int, now: float) -> None:
        self.qps, self.burst = qps, burst
        self._tokens, self._at = float(burst), now

    def reserve(self, now: float) -> float:
        elapsed = max(0.0, now - self._at)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)
        self._at = max(self._at, now)
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


class Throttle:
    """Rate-limits the writes and waits out throttling answers of one REST client."""

    def __init__(
        self,
        settings: WriteSettings,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._bucket = TokenBucket(settings.qps, settings.burst, clock()) if settings.qps else None

    def install(self, api: Any) -> None:
        """Wrap ``api`` (a kubernetes ``ApiClient``): its REST client's request goes through
        ``send``, and its connection pool holds as many connections as writes in flight."""
        rest = api.rest_client
        pools = rest.pool_manager
        pools.connection_pool_kw["maxsize"] = max(
            pools.connection_pool_kw.get("maxsize") or 1, self.settings.max_in_flight
        )
        pools.clear()  # pools made before this would keep their old size
        inner = rest.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            return self.send(inner, method, url, *args, **kwargs)

        rest.request = request

    def send(self, inner: Callable[..., Any], method: str, *args: Any, **kwargs: Any) -> Any:
        waited = 0.0
        while True:
            if method in MUTATING:
                self._pace()
            response = inner(method, *args, **kwargs)
            if response.status not in (429, 503):
                return response
            # Read whole (a Status, small), so its connection goes back to the pool and
            # the caller still gets the body.
            delay = retry_after(response.status, response.headers, response.read() or b"")
            budget = self.settings.throttled_budget_seconds - waited
            if delay is None or budget <= 0:
                return response
            delay = min(delay, self.settings.max_retry_after_seconds, budget)
            THROTTLED.labels(method).inc()
            log.debug(
                "%s %s throttled (%s); again in %.1fs", method, args[0], response.status, delay
            )
            self._sleep(delay)
            waited += delay

    def _pace(self) -> None:
        if self._bucket is None:
            return
        with self._lock:
            delay = self._bucket.reserve(self._clock())
        if delay > 0:
            self._sleep(delay)


@dataclass(frozen=True)
class Write:
    what: str
    """What the write does, for its failure message: ``creating Pod ns/name``."""
    call: Callable[[], object]


class WritePool:
    """Runs batches of independent writes, at most ``max_in_flight`` at once in all."""

    def __init__(self, max_in_flight: int, describe: Callable[[ApiException], str]) -> None:
        self.max_in_flight = max_in_flight
        self._describe = describe
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="kmodkit-write")
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0

    def run(self, writes: Iterable[Write]) -> list[str | None]:
        """Run every write of the batch; per write, None if it succeeded or what the
        apiserver said when it refused. A refusal never stops the others; an
        exception that is not the apiserver's (a bug) is raised once all are done."""
        return self.run_for(list(writes), math.inf)

    def run_for(
        self, writes: Sequence[Write], seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> list[str | None]:
        """``run``, but a write is started only while ``seconds`` have not passed (the first
        always is): the results of those started, a prefix of ``writes``. Writes start as
        others end, so the pool stays full until the time is up (rounds that each waited
        for their slowest write would idle it behind every throttled one)."""
        deadline = clock() + seconds
        slots = threading.Semaphore(self.max_in_flight)
        futures: list[Future[str | BaseException | None]] = []
        for write in writes:
            slots.acquire()
            if futures and clock() >= deadline:
                slots.release()
                break
            future = self._pool.submit(self._one, write)
            future.add_done_callback(lambda _: slots.release())
            futures.append(future)
        results = [f.result() for f in futures]
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [r for r in results if not isinstance(r, BaseException)]

    def failures(self, writes: Iterable[Write]) -> list[str]:
        return [r for r in self.run(writes) if r is not None]

    def _one(self, write: Write) -> str | BaseException | None:
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            IN_FLIGHT.set(self.in_flight)
            IN_FLIGHT_MAX.set(self.peak)
        try:
            write.call()
        except ApiException as err:
            said = self._describe(err)
            log.warning("%s failed: %s", write.what, said)
            return f"{write.what}: {said}"
        except Exception as err:
            return err
        finally:
            with self._lock:
                self.in_flight -= 1
                IN_FLIGHT.set(self.in_flight)
        return None
