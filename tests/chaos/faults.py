"""What the fault proxy does to the operator's requests, and what it saw them do.

One ``ApiFaults`` sits in the loopback proxy between every operator replica and
the apiserver (one listener per replica, so it knows who asked). It

- answers some requests itself, at seeded random rates: 429 with Retry-After on
  any request, 409 Conflict on node writes, and a watch that ends at once with an
  expired (410) resourceVersion;
- cuts some watch streams after a few seconds (a dropped connection);
- records every write the apiserver accepted, by replica and time (the
  one-active-replica invariant is read from it);
- kills a replica at a chosen point: once a request matching an armed trap has
  been answered by the apiserver and before the replica hears the answer.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LEASES = "/apis/coordination.k8s.io/"


def _status(code: int, reason: str, message: str) -> dict[str, object]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


@dataclass(frozen=True)
class Trap:
    """Kill the replica right after the apiserver accepted a request like this."""

    name: str
    matches: Callable[[str, str, bytes], bool]
    """(method, path, body) -> whether this request springs the trap."""


def cordon_write(method: str, path: str, body: bytes) -> bool:
    return method == "PATCH" and path.startswith("/api/v1/nodes/") and b'"unschedulable"' in body


def eviction(method: str, path: str, body: bytes) -> bool:
    return method == "POST" and path.endswith("/eviction")


def swap(method: str, path: str, body: bytes) -> bool:
    """The Tenstorrent swaps: a stale builder pod deleted, a flash Job created."""
    builder = method == "DELETE" and "/pods/ttdrv-" in path
    flash = method == "POST" and path.endswith("/jobs") and b"tt-flasher" in body
    return builder or flash


def any_write(method: str, path: str, body: bytes) -> bool:
    return method in WRITES and not path.startswith(LEASES) and "/events" not in path


TRAPS = {
    "after-cordon-write": Trap("after-cordon-write", cordon_write),
    "mid-eviction": Trap("mid-eviction", eviction),
    "after-swap-before-state": Trap("after-swap-before-state", swap),
    "first-write-after-start": Trap("first-write-after-start", any_write),
}


@dataclass
class Write:
    at: float
    replica: int
    method: str
    path: str


@dataclass
class ApiFaults:
    rng: random.Random
    kill: Callable[[int, str], None]
    """Called with the replica and the trap's name; must SIGKILL that replica at once."""
    throttle_rate: float = 0.0
    conflict_rate: float = 0.0
    expire_rate: float = 0.0
    drop_rate: float = 0.0
    injected: Counter[str] = field(default_factory=Counter)
    writes: list[Write] = field(default_factory=list)
    _armed: dict[int, Trap] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def off(self) -> None:
        self.throttle_rate = self.conflict_rate = self.expire_rate = self.drop_rate = 0.0

    def arm(self, replica: int, trap: Trap) -> None:
        with self._lock:
            self._armed[replica] = trap

    def disarm(self, replica: int) -> Trap | None:
        with self._lock:
            return self._armed.pop(replica, None)

    def answer(self, listener: int, request: web.Request, body: bytes) -> web.Response | None:
        watching = request.query.get("watch") in ("1", "true")
        with self._lock:
            roll = self.rng.random()
        if roll < self.throttle_rate:
            self.injected["429"] += 1
            return web.json_response(
                _status(429, "TooManyRequests", "the proxy throttles this request"),
                status=429,
                headers={"Retry-After": "1"},
            )
        roll -= self.throttle_rate
        node_write = request.method in ("PATCH", "PUT") and request.path.startswith(
            "/api/v1/nodes/"
        )
        if node_write and roll < self.conflict_rate:
            self.injected["409"] += 1
            return web.json_response(
                _status(409, "Conflict", "the object has been modified (the proxy says)"),
                status=409,
            )
        if watching and roll < self.expire_rate:
            self.injected["410"] += 1
            event = {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}
            return web.Response(text=json.dumps(event) + "\n", content_type="application/json")
        return None

    def stream_limit(self, listener: int, request: web.Request) -> float | None:
        if request.query.get("watch") not in ("1", "true"):
            return None
        with self._lock:
            cut = self.rng.random() < self.drop_rate
            after = self.rng.uniform(0.5, 8.0)
        if cut:
            self.injected["watch-drop"] += 1
            return after
        return None

    def answered(self, listener: int, request: web.Request, body: bytes, status: int) -> None:
        method, path = request.method, request.path
        if status < 400 and any_write(method, path, body):
            with self._lock:
                self.writes.append(Write(time.monotonic(), listener, method, path))
        with self._lock:
            trap = self._armed.get(listener)
            sprung = trap is not None and status < 400 and trap.matches(method, path, body)
            if sprung:
                del self._armed[listener]
        if sprung:
            assert trap is not None
            self.kill(listener, trap.name)
