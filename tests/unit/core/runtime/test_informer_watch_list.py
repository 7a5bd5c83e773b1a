"""The informer's watch-list: the initial events land whole, at the bookmark that ends them,
or not at all. The lister is a stand-in answering a stream of watch events as the
apiserver would (``Stream``); the real apiserver's answers are in
tests/integration/test_informer.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from kmodkit.core.runtime.informer import INITIAL_EVENTS_END, Informer
from kmodkit.core.runtime.informer_cache import Change


def _node(name: str, rv: str, **labels: str) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "resourceVersion": rv, "labels": labels}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def _end(rv: str) -> dict[str, Any]:
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}
    return _event("BOOKMARK", {"kind": "Node", "metadata": meta})


class Stream:
    """Stands in for the HTTP client's response to a watch: ``events``, one a line, split
    across chunks, then the end of the body."""

    status_code = 200

    def __init__(self, events: list[dict[str, Any]]) -> None:
        body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self._chunks = [body[i : i + 7] for i in range(0, len(body), 7)]

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        pass


async def _watched(
    streams: list[list[dict[str, Any]]],
) -> tuple[Informer[dict[str, Any]], list[list[Change[dict[str, Any]]]], list[dict[str, Any]]]:
    """Each call of the lister answers the next stream; the informer runs until they are
    all used. Returns it, what its subscriber was given, and the calls' parameters."""
    calls: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def lister(**params: Any) -> Stream:
        calls.append(params)
        if len(calls) > len(streams):
            done.set()
            await asyncio.Event().wait()  # the next watch: nothing more comes
        return Stream(streams[len(calls) - 1])

    informer: Informer[dict[str, Any]] = Informer("nodes", lister, view=dict, backoff=(0, 0))
    delivered: list[list[Change[dict[str, Any]]]] = []
    informer.subscribe(lambda changes: delivered.append(list(changes)))
    informer.start()
    await asyncio.wait_for(done.wait(), 5)
    await informer.stop()
    return informer, delivered, calls


def test_the_initial_events_land_whole_at_their_end_then_the_watch_goes_on() -> None:
    a, b = _node("a", "5"), _node("b", "6")
    later = _node("a", "8", moved="yes")
    informer, delivered, calls = asyncio.run(
        _watched([[_event("ADDED", a), _event("ADDED", b), _end("7"), _event("MODIFIED", later)]])
    )
    assert calls[0]["send_initial_events"] is True
    assert calls[0]["resource_version_match"] == "NotOlderThan"
    # One delivery for the listing, as a list's, then one per event.
    assert [sorted(c.key for c in d) for d in delivered] == [[("", "a"), ("", "b")], [("", "a")]]
    assert informer.views() == {("", "a"): later, ("", "b"): b}
    assert informer.lists == 1 and informer.cache.resource_version == "8"
    # The stream ended (the server's timeout): the next watch resumes where it was.
    assert calls[1]["resource_version"] == "8" and "send_initial_events" not in calls[1]


def test_initial_events_cut_short_never_land_and_the_watch_list_is_asked_again() -> None:
    a, b = _node("a", "5"), _node("b", "6")
    informer, delivered, calls = asyncio.run(
        _watched([[_event("ADDED", a)], [_event("ADDED", a), _event("ADDED", b), _end("7")]])
    )
    # The first stream ended before its bookmark: a part of the nodes is not a listing.
    assert [len(d) for d in delivered] == [2]
    assert calls[1]["send_initial_events"] is True
    assert informer.views() == {("", "a"): a, ("", "b"): b} and informer.lists == 1
