"""A watch that never gives up: every change of a kind, in order, on a thread.

It talks to the apiserver directly (not through the fault proxy), resumes from
the last resourceVersion it saw when a stream ends or the apiserver restarts,
and lists afresh when that version has expired. A fresh list may skip changes,
so the handler is told (``relisted``) and checks that need every step skip it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

Handler = Callable[[str, dict[str, Any], bool], None]
"""(event type, object as JSON, whether this follows a fresh list) -> None."""


class WatchFeed:
    def __init__(self, name: str, list_fn: Callable[..., Any], handler: Handler, **kw: Any):
        self.name = name
        self._list = list_fn
        self._handler = handler
        self._kw = kw
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.errors: list[str] = []
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version: str | None = None
        relisted = True
        while not self._stop.is_set():
            self._watch = watch.Watch()
            try:
                if version is None:
                    listed = self._list(_preload_content=False, **self._kw)
                    body = json.loads(listed.data)
                    version = body["metadata"]["resourceVersion"]
                    for item in body["items"]:
                        self._handler("LISTED", item, True)
                    self.synced.set()
                    relisted = True
                for event in self._watch.stream(
                    self._list,
                    resource_version=version,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                    **self._kw,
                ):
                    obj = event["raw_object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._handler(event["type"], obj, relisted)
                        relisted = False
            except ApiException as err:
                if err.status == 410:
                    version = None
                elif not self._stop.is_set():
                    time.sleep(0.5)
            except Exception as err:  # the apiserver went away: resume from `version`
                if self._stop.is_set():
                    return
                if not _is_connection_error(err):
                    self.errors.append(f"{self.name}: {err!r}")
                time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=5)


def _is_connection_error(err: Exception) -> bool:
    text = repr(err)
    return any(
        marker in text
        for marker in ("Connection", "ProtocolError", "MaxRetryError", "IncompleteRead", "EOF")
    )
