"""Kubernetes Events, deduplicated the way ``kubectl describe`` readers know.

An event that happens again is one Event with a higher ``count`` and a newer
``lastTimestamp`` (``x3 over 5m``), not a new line. Once more than
``SIMILAR_LIMIT`` different messages with the same reason have been posted
about one object within ``SIMILAR_WINDOW``, further ones are folded into a
single ``(combined from similar events)`` Event: a 10,000-node rollout leaves a
readable event list on its policy and a bounded number of writes.

Three kinds of post, told apart by ``repeat_after``:

- ``0`` (an occurrence, such as a rollout transition): every post counts.
- ``ONCE`` (a fact about one thing, such as a build's start): posted at most
  once; an Event of the same content already in the cluster counts as posted.
- a number of seconds (a condition that holds, seen on every pass, such as an
  unload refused): reported again at most that often; after a restart the
  Event the previous process left counts as posted, so a start costs no writes.

Event names are derived from their content, so a restart finds the Event it
posted before (409 on create) instead of adding a second one.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core.sending import send

log = logging.getLogger(__name__)

ONCE = math.inf
CONDITION_REPEAT_SECONDS = 600.0
"""How often a condition that still holds is reported again (its count rises)."""
SIMILAR_LIMIT = 10
SIMILAR_WINDOW = 600.0
CAPACITY = 4096
"""Events remembered per process; the oldest is forgotten first."""
MAX_MESSAGE = 1024
MAX_NAME_PREFIX = 200
"""Of the object's name in an Event's name (which is at most 253 characters)."""
COMBINED = "(combined from similar events): "
COMPONENT = "kmodkit"


@dataclass(frozen=True)
class Event:
    involved: tuple[tuple[str, str], ...]
    """The object reference (apiVersion, kind, namespace, name, uid), as sorted pairs."""
    warning: bool
    reason: str
    message: str

    @property
    def object_name(self) -> str:
        return dict(self.involved).get("name") or COMPONENT

    @property
    def namespace(self) -> str:
        # A cluster-scoped object's Events live in "default", as kubectl looks for them.
        return dict(self.involved).get("namespace") or "default"


def event(involved: Mapping[str, Any], reason: str, message: str, warning: bool) -> Event:
    ref = tuple(sorted((k, str(v)) for k, v in involved.items() if v))
    return Event(ref, warning, reason, message[:MAX_MESSAGE])


@dataclass(frozen=True)
class Write:
    """One Event to create (``count`` 1) or to bring up to ``count``."""

    key: tuple[Any, ...]
    name: str
    message: str
    count: int
    create: bool


@dataclass
class _Posted:
    name: str
    count: int
    at: float


class Correlator:
    """Decides, from what this process posted, what an event costs in writes (pure)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._posted: OrderedDict[tuple[Any, ...], _Posted] = OrderedDict()
        self._messages: OrderedDict[tuple[Any, ...], dict[str, float]] = OrderedDict()

    def decide(self, ev: Event, now: float, repeat_after: float) -> Write | None:
        """The write ``ev`` needs, or None when it needs none."""
        key, message = self._aggregate(ev, now)
        seen = self._posted.get(key)
        if seen is None:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            name = f"{ev.object_name[:MAX_NAME_PREFIX]}.{digest}"
            return Write(key, name, message, 1, create=True)
        self._posted.move_to_end(key)
        if now - seen.at < repeat_after:
            return None
        return Write(key, seen.name, message, seen.count + 1, create=False)

    def posted(self, write: Write, count: int, now: float) -> None:
        """Record that the cluster now holds ``write``'s Event with ``count``."""
        self._posted[write.key] = _Posted(write.name, count, now)
        self._posted.move_to_end(write.key)
        while len(self._posted) > self._capacity:
            self._posted.popitem(last=False)

    def _aggregate(self, ev: Event, now: float) -> tuple[tuple[Any, ...], str]:
        similar = (ev.involved, ev.warning, ev.reason)
        recent = {
            m: at for m, at in self._messages.pop(similar, {}).items() if now - at < SIMILAR_WINDOW
        }
        self._messages[similar] = recent
        while len(self._messages) > self._capacity:
            self._messages.popitem(last=False)
        if ev.message in recent or len(recent) < SIMILAR_LIMIT:
            recent[ev.message] = now
            return (*similar, ev.message), ev.message
        return (*similar, COMBINED), (COMBINED + ev.message)[:MAX_MESSAGE]


PROCESS = Correlator()
"""What this process posted: shared by every recorder, so repeats are seen whoever posts."""


def node_reference(node: Mapping[str, Any]) -> dict[str, Any]:
    """The event reference of a node; ``kubectl describe node`` matches on name and uid."""
    meta = node.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "name": meta.get("name"), "uid": meta.get("uid")}


class Recorder:
    """Posts Events through a ``Correlator``; a refused Event is logged, never raised."""

    _lock = threading.Lock()
    """Shared with every recorder, as the process's correlator is."""

    def __init__(self, core: client.CoreV1Api, correlator: Correlator = PROCESS) -> None:
        self.core = core
        self.correlator = correlator

    def post(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = False,
        repeat_after: float = 0.0,
        now: datetime | None = None,
    ) -> bool:
        """Post one event about ``involved`` (a reference: apiVersion, kind, name, uid,
        namespace); whether the cluster holds it now."""
        ev = event(involved, reason, message, warning)
        at = now or datetime.now(UTC)
        # The lock guards the correlator only: a write never waits for another's round
        # trip. Two threads posting one new Event meet at the apiserver (409), and the
        # second counts up; two bumping at once may count one occurrence short.
        with self._lock:
            write = self.correlator.decide(ev, at.timestamp(), repeat_after)
        if write is None:
            return True
        try:
            count = self._write(ev, write, at, repeat_after)
        except ApiException as err:
            log.warning(
                "could not post event %s on %s %s: %s",
                reason,
                dict(ev.involved).get("kind"),
                ev.object_name,
                err.reason,
            )
            return False
        with self._lock:
            self.correlator.posted(write, count, at.timestamp())
        return True

    def _write(self, ev: Event, write: Write, at: datetime, repeat_after: float) -> int:
        if not write.create:
            try:
                self._bump(ev, write.name, write.message, write.count, at)
                return write.count
            except ApiException as err:
                if err.status != 404:  # expired (Events live an hour): post it anew
                    raise
        try:
            send(self.core.create_namespaced_event, ev.namespace, cast(Any, _body(ev, write, at)))
            return 1
        except ApiException as err:
            if err.status != 409:
                raise
        # Posted by an earlier process (or before this one forgot it).
        existing: Any = self.core.read_namespaced_event(write.name, ev.namespace)
        count = int(existing.count or 1)
        if repeat_after:
            return count
        self._bump(ev, write.name, write.message, count + 1, at)
        return count + 1

    def _bump(self, ev: Event, name: str, message: str, count: int, at: datetime) -> None:
        patch = {"count": count, "lastTimestamp": _time(at), "message": message}
        send(self.core.patch_namespaced_event, name, ev.namespace, patch)


def _body(ev: Event, write: Write, at: datetime) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": write.name, "namespace": ev.namespace},
        "involvedObject": dict(ev.involved),
        "reason": ev.reason,
        "message": write.message,
        "type": "Warning" if ev.warning else "Normal",
        "firstTimestamp": _time(at),
        "lastTimestamp": _time(at),
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }


def _time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
