"""The loader's readiness, answered over HTTP from what its serving loop last saw.

The kubelet probes every loader pod every 10 s. Answering with a fresh
``kmodkit-agent status`` process meant a Python start and a ``modinfo`` per
module each time, on every node; one slow answer took the ready label (and
the device plugin) away. The serving loop looks at the kernel anyway (it loads
a vanished driver again), so it keeps its last answer here and the probe only
reads it. An answer older than ``stale_after`` is not ready: a loop that stopped
looking must not keep a node labelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY_PATH = "/readyz"


class Readiness:
    """The serving loop's last look at the kernel, and when it was."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._lock = threading.Lock()
        self._problems: tuple[str, ...] | None = None
        self._at = 0.0

    def record(self, problems: Sequence[str]) -> bool:
        """Keep the problems seen now; True when they differ from the last ones."""
        with self._lock:
            changed = self._problems != tuple(problems)
            self._problems, self._at = tuple(problems), self._clock()
        return changed

    def answer(self) -> tuple[bool, str]:
        """(ready, why) as the probe reports it."""
        with self._lock:
            problems, age = self._problems, self._clock() - self._at
        if problems is None:
            return False, "not ready: still loading"
        if age > self._stale_after:
            return False, f"not ready: the kernel was last checked {age:.0f}s ago"
        if problems:
            return False, "not ready: " + "; ".join(problems)
        return True, "ready"


def serve_readiness(readiness: Readiness, port: int, host: str = "") -> ThreadingHTTPServer:
    """Answer ``GET /readyz`` (200 or 503) on ``port`` from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != READY_PATH:
                self.send_error(404)
                return
            ready, why = readiness.answer()
            body = f"{why}\n".encode()
            self.send_response(200 if ready else 503)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # A line per probe would bury the agent's own JSON lines.
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="readiness", daemon=True).start()
    return server
