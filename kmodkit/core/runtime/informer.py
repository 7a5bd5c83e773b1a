"""One list+watch per kind, over ``informer_http``'s client, into an InformerCache.

The loop: a list becomes the cache; a watch starts at the list's
resourceVersion with bookmarks on and a server-side timeout, and each event
(and bookmark) advances the resourceVersion the next watch resumes from. A
watch that ends (its timeout, a dropped connection, an apiserver restart) is
resumed from there after a backoff; the apiserver answers 410 Gone when it no
longer holds that history, and only then is the kind listed again.

A list is a watch-list where the apiserver serves one (Kubernetes 1.32 and
later): a watch with ``sendInitialEvents`` streams every object as ADDED, then
a bookmark marked ``k8s.io/initial-events-end`` that says they are all there,
and goes on as the watch. The apiserver encodes while the informer decodes,
with no round trip per page and one object in memory at a time: at 10,000
loader pods it lands in about half the time of a paged list. An apiserver that
refuses it (400 or 422: older ones forbid ``resourceVersionMatch`` on a watch)
is listed in pages (``limit``, ``continue``) from then on.

A relist keeps serving the old cache until the new list has landed, then
swaps it in whole and reports the difference (deletes missed while
disconnected included) to the subscribers. ``synced`` is set once the first
list has landed and stays set: an old cache is stale, as every watch cache is
by a little, but never partial, and partial is what a pass must not see.

Selectors are sent to the apiserver: only matching objects are sent, and an
object that stops matching arrives as DELETED.

A kind the apiserver does not serve (404: a CRD not installed, an API group the
cluster lacks) has no objects: the cache is empty and synced, and the kind is
listed again now and then (the backoff's longest wait), so it fills once served.
The apiserver authorizes before it routes, so a client without list on a kind it
does not serve is answered 403, not 404 (and an audit log shows a refusal):
``kind_lister`` asks discovery, which every client may read, before each list,
and a kind discovery does not name is not served. A 403 on a served kind stays
an error: the cache is not synced and a pass waits, as it must not take "may
not see any" for "there are none".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic

import orjson

from kmodkit.core.runtime.informer_cache import (
    BOOKMARK,
    Change,
    Entry,
    InformerCache,
    Key,
    V,
    key_of,
    meta_of,
)
from kmodkit.core.runtime.informer_http import Answer, ApiHttp

log = logging.getLogger("kmodkit.informer")

Subscriber = Callable[[Sequence[Change[V]]], None]
"""Called with the views that changed: one change per watch event, and the whole
difference at once when a relist lands (so a subscriber can swap its own copy whole)."""
Lister = Callable[..., Awaitable[Answer]]
"""A list (or watch) call of one kind (``kind_lister``): its parameters as keywords
(``QUERY_NAMES``) and the request's ``read_timeout``; the answer's body not read yet."""

PAGE = 500
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
"""The annotation of the bookmark that ends a watch-list's initial events."""
REFUSED_WATCH_LIST = (400, 422)
WATCH_TIMEOUT_SECONDS = 300
BACKOFF_SECONDS = (0.2, 30.0)
"""First and longest wait before a failed list or watch is tried again (it doubles)."""
REQUEST_TIMEOUT_SECONDS = 60.0
FORBIDDEN_HINT = (
    " (the operator's role lacks list and watch on this kind, so the passes that read it"
    " wait: grant them, or enable the chart setting that does)"
)


class Gone(Exception):
    """The apiserver no longer holds the history asked for (410): list again."""


class StatusError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class NotServed(Exception):
    """The apiserver does not serve the kind (404 on the list, or a 403 on a kind
    discovery does not name)."""


QUERY_NAMES = {
    "limit": "limit",
    "_continue": "continue",
    "label_selector": "labelSelector",
    "field_selector": "fieldSelector",
    "watch": "watch",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "send_initial_events": "sendInitialEvents",
    "resource_version_match": "resourceVersionMatch",
}
"""The informer's list and watch parameters, as keywords and as the apiserver names them."""


def kind_lister(group: str, version: str, plural: str) -> Callable[[ApiHttp], Lister]:
    """The list (and watch) call of every object of one kind, in every namespace, for any
    kind the apiserver may serve (``/api/v1/nodes``, ``/apis/apps/v1/daemonsets``, a CRD's)."""
    group_version = f"/apis/{group}/{version}" if group else f"/api/{version}"
    path = f"{group_version}/{plural}"

    def lister(api: ApiHttp) -> Lister:
        async def call(*, read_timeout: float, **params: Any) -> Answer:
            query = {
                QUERY_NAMES[k]: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in params.items()
                if v is not None
            }
            starts_a_list = (
                not params.get("watch") or params.get("send_initial_events")
            ) and not params.get("_continue")
            if starts_a_list and not await _discovered(api, group_version, plural):
                raise NotServed(f"{path}: not in the apiserver's discovery")
            return await api.get(path, query, read_timeout)

        return call

    return lister


async def _discovered(api: ApiHttp, group_version: str, plural: str) -> bool:
    """Whether the apiserver's discovery names ``plural`` in ``group_version``."""
    try:
        body = await _json(await api.get(group_version, {}, REQUEST_TIMEOUT_SECONDS))
    except NotServed:
        return False
    return any(r.get("name") == plural for r in body.get("resources") or [])


async def _json(resp: Answer) -> Any:
    try:
        raw = await resp.aread()
    finally:
        await resp.aclose()
    if resp.status_code != 200:
        _raise_status(resp.status_code, raw.decode(errors="replace"))
    return orjson.loads(raw)


def _item_kind(listed: Mapping[str, Any]) -> str:
    """The kind of a list's items: ``ConfigMapList`` holds ``ConfigMap``s."""
    return str(listed.get("kind") or "").removesuffix("List")


def _raise_status(status: int, message: str) -> None:
    if status == 410:
        raise Gone(message)
    if status == 404:
        raise NotServed(message)
    raise StatusError(status, message)


async def _lines(resp: Answer) -> AsyncIterator[bytes]:
    """The response body split at newlines, however long a line (a big object) is."""
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        buf += chunk
        while (end := buf.find(b"\n")) >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            if line.strip():
                yield line


class Informer(Generic[V]):
    def __init__(
        self,
        name: str,
        lister: Lister,
        *,
        view: Callable[[Mapping[str, Any]], V],
        label_selector: str = "",
        field_selector: str = "",
        page: int = PAGE,
        watch_timeout: int = WATCH_TIMEOUT_SECONDS,
        backoff: tuple[float, float] = BACKOFF_SECONDS,
    ) -> None:
        self.name = name
        self.cache: InformerCache[V] = InformerCache(view)
        self.synced = asyncio.Event()
        self.lists = 0
        """Lists that landed: 1 after the start, one more per relist."""
        self.watch_lists = True
        """Lists are watch-lists (until the apiserver refuses one)."""
        self._listed = False
        self._lister = lister
        self._selectors = {
            k: v
            for k, v in (("label_selector", label_selector), ("field_selector", field_selector))
            if v
        }
        self._page = page
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._subscribers: list[Subscriber[V]] = []
        self._task: asyncio.Task[None] | None = None
        self._again = asyncio.Event()

    def subscribe(self, subscriber: Subscriber[V]) -> None:
        self._subscribers.append(subscriber)

    def views(self) -> dict[Key, V]:
        return self.cache.views()

    def look_again(self) -> None:
        """End a wait between tries now: the kind may be served since (a CRD appeared)."""
        self._again.set()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        wait = self._backoff[0]
        while True:
            try:
                if self._listed:
                    await self._watch()
                elif self.watch_lists:
                    await self._watch(initial=True)
                else:
                    await self._list()
                    continue
                wait = self._backoff[0]
                continue  # the server's timeout ended it: resume at once
            except Gone as err:
                log.info("%s: history gone (%s); listing again", self.name, err)
                self._listed = False
                continue
            except NotServed:
                # There is none of it (a CRD removed mid-list included), which a pass
                # may rely on as on any list. Said once; the kind is looked for again
                # at every backoff.
                self._land({}, "")
                self._listed = False
                level = logging.DEBUG if self.lists > 1 else logging.INFO
                log.log(level, "%s: not served by the apiserver; none there", self.name)
            except asyncio.CancelledError:
                raise
            except StatusError as err:
                if not self._listed and self.watch_lists and err.status in REFUSED_WATCH_LIST:
                    log.info("%s: no watch-list here (%s); listing in pages", self.name, err)
                    self.watch_lists = False
                    continue
                # An answer, not a lost connection: the watch is not to be trusted to resume.
                hint = FORBIDDEN_HINT if err.status == 403 else ""
                log.warning("%s: %s%s; listing again in %.1fs", self.name, err, hint, wait)
                self._listed = False
            except Exception as err:  # a dropped or refused connection: resume where we were
                log.warning("%s: watch failed (%r); retrying in %.1fs", self.name, err, wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._again.wait(), wait)
            self._again.clear()
            wait = min(wait * 2, self._backoff[1])

    def _deliver(self, changes: list[Change[V]]) -> None:
        if not changes:
            return
        for subscriber in self._subscribers:
            try:
                subscriber(changes)
            except Exception:
                log.exception("%s: a subscriber failed on %d changes", self.name, len(changes))

    def _land(self, fresh: dict[Key, Entry[V]], version: str) -> None:
        """A whole listing (``fresh``, as of ``version``) becomes the cache."""
        self._deliver(self.cache.replace_entries(fresh, version))
        self._listed = True
        self.lists += 1
        self.synced.set()

    async def _list(self) -> None:
        """A paged list, for an apiserver without watch-lists."""
        fresh: dict[Key, Entry[V]] = {}
        token: str | None = None
        version = ""
        while True:
            body = await _json(
                await self._lister(
                    limit=self._page,
                    _continue=token,
                    read_timeout=REQUEST_TIMEOUT_SECONDS,
                    **self._selectors,
                )
            )
            meta = body.get("metadata") or {}
            # Every page is served from the first page's snapshot.
            version = version or str(meta.get("resourceVersion") or "")
            # A list's items carry no apiVersion and kind, a watch's objects do: the list's
            # are given them, so views are alike whichever brought the object.
            kind = {"apiVersion": body.get("apiVersion"), "kind": _item_kind(body)}
            for obj in body.get("items") or []:
                fresh[key_of(obj)] = self.cache.entry({**kind, **obj})
            token = meta.get("continue") or None
            if token is None:
                break
        self._land(fresh, version)

    async def _watch(self, *, initial: bool = False) -> None:
        """Watch from the cache's resourceVersion; ``initial``: a watch-list, whose
        initial events land as a list does before the watch goes on."""
        since: dict[str, Any] = (
            {"send_initial_events": True, "resource_version_match": "NotOlderThan"}
            if initial
            else {"resource_version": self.cache.resource_version}
        )
        resp = await self._lister(
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            # The server ends the watch after timeout_seconds, so silence much longer
            # than that is a connection that died without a word.
            read_timeout=self._watch_timeout + REQUEST_TIMEOUT_SECONDS,
            **since,
            **self._selectors,
        )
        fresh: dict[Key, Entry[V]] | None = {} if initial else None
        try:
            if resp.status_code != 200:
                _raise_status(resp.status_code, (await resp.aread()).decode(errors="replace"))
            async for line in _lines(resp):
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    _raise_status(int(obj.get("code") or 0), str(obj.get("message") or obj))
                if fresh is None:
                    change = self.cache.apply(str(kind), obj)
                    if change is not None:
                        self._deliver([change])
                elif kind != BOOKMARK:
                    fresh[key_of(obj)] = self.cache.entry(obj)  # each object once, as ADDED
                elif (meta_of(obj).get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                    self._land(fresh, str(meta_of(obj).get("resourceVersion") or ""))
                    fresh = None
        finally:
            await resp.aclose()  # a watch cut short leaves unread bytes: never back into the pool
