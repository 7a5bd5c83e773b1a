"""Operator replicas under test: ``kmodkit run``, started, SIGKILLed and started again.

Each replica has its own listener on the fault proxy (so every request it makes
is known to be its own) and its own log, appended to by each incarnation. A
kill is a SIGKILL sent at once; the process is reaped later, by ``restart``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kmodkit_dev.operator import Operator, launch

SWAP_CALL = re.compile(r"rollout (\S+) on node (\S+): swap hook called for (\S+)")


@dataclass
class Life:
    """One incarnation of a replica."""

    started: float
    killed: float | None = None
    how: str = ""


@dataclass
class Replica:
    index: int
    kubeconfig: Path
    log: Path
    env: dict[str, str]
    args: tuple[str, ...] = ()
    op: Operator | None = None
    lives: list[Life] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        with self._lock:
            self.op = launch(self.kubeconfig, self.log, *self.args, **self.env)
            self.lives.append(Life(time.monotonic()))

    def kill(self, how: str) -> bool:
        """SIGKILL the running incarnation; False if it was not running."""
        with self._lock:
            if self.op is None or self.op.proc.poll() is not None:
                return False
            self.op.proc.kill()
            self.lives[-1].killed, self.lives[-1].how = time.monotonic(), how
            return True

    def restart(self) -> None:
        with self._lock:
            if self.op is not None:
                self.op.kill()  # reaps a killed one; kills one that was not
                if self.lives[-1].killed is None:
                    self.lives[-1].killed = time.monotonic()
        self.start()

    def stop(self) -> None:
        with self._lock:
            if self.op is not None:
                self.op.stop()
                if self.lives and self.lives[-1].killed is None:
                    self.lives[-1].killed, self.lives[-1].how = time.monotonic(), "stop"

    @property
    def alive(self) -> bool:
        return self.op is not None and self.op.proc.poll() is None

    def unexpected_exits(self) -> list[str]:
        """Incarnations that ended by themselves (a crash, not one of our kills)."""
        if self.op is not None and self.op.proc.poll() not in (None, -9) and not self.lives[-1].how:
            return [f"replica {self.index} exited with {self.op.proc.returncode}"]
        return []

    def swap_calls(self) -> Counter[tuple[str, str, str]]:
        """Every swap-hook call its incarnations logged: (rollout, node, target) -> calls."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return Counter(m.groups() for m in SWAP_CALL.finditer(text))  # type: ignore[misc]


def activity_overlaps(writes: list[tuple[float, int]], lives: dict[int, list[Life]]) -> list[str]:
    """Pairs of incarnations of different replicas that both wrote within one stretch of time.

    An incarnation's activity runs from its first accepted write to its last;
    exactly one replica active at a time means no two such stretches overlap.
    """
    spans: dict[tuple[int, int], list[float]] = {}
    for at, replica in writes:
        # Lives follow one another: a write belongs to the latest one started before it.
        life = max((i for i, life in enumerate(lives[replica]) if life.started <= at), default=-1)
        span = spans.setdefault((replica, life), [at, at])
        span[0], span[1] = min(span[0], at), max(span[1], at)
    found = []
    items = sorted(spans.items(), key=lambda kv: kv[1][0])
    for i, ((r1, l1), (a1, b1)) in enumerate(items):
        for (r2, l2), (a2, b2) in items[i + 1 :]:
            if r1 != r2 and a2 < b1:
                found.append(
                    f"replica {r1} (life {l1}) wrote during [{a1:.2f}, {b1:.2f}] and "
                    f"replica {r2} (life {l2}) during [{a2:.2f}, {b2:.2f}]"
                )
    return found
