"""Watch caches shared by every controller in the process, and their wake-ups.

These hold what the watches last said (nodes, served API groups) and which
reconcile loops to wake; they are rebuilt from the watch streams after a
restart and never hold progress. Nodes come from an Informer (one list+watch,
slim views); the few custom resources and CRDs from kopf.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf
from kubernetes import client

from kmodkit.core.engine.node_interest import Interest, Moved
from kmodkit.core.nodes import NodeView, node_view, slim_node
from kmodkit.core.runtime.informer import Informer, Lister, Subscriber, kind_lister
from kmodkit.core.runtime.informer_cache import Change
from kmodkit.core.runtime.informer_http import ApiHttp, api_client
from kmodkit.core.runtime.kube import Kube
from kmodkit.core.runtime.owned_index import OwnedIndex

G = TypeVar("G", bound=Hashable)
log = logging.getLogger("kmodkit.caches")

CACHE_WAIT_SECONDS = 1.0
"""How soon a pass that found the node cache still filling tries again."""


class Wakeups:
    """One asyncio.Event per reconcile loop, set when its inputs change, and when it was
    first set since the loop last cleared it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}
        self._first: dict[Hashable, float] = {}
        self._interests: dict[Hashable, Interest] = {}
        self._clock = clock

    def event(self, key: Hashable) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def drop(self, key: Hashable) -> None:
        self._events.pop(key, None)
        self._first.pop(key, None)
        self._interests.pop(key, None)

    def interest(self, key: Hashable, interest: Interest) -> None:
        """Wake ``key`` for the nodes' changes ``interest`` accepts only; a loop that never
        said is woken by every node change that moved a view."""
        self._interests[key] = interest

    def wake_for_nodes(self, moved: Moved) -> None:
        for key, event in self._events.items():
            interest = self._interests.get(key)
            if interest is None or interest(moved):
                self._set(key, event)

    def wake(self, key: Hashable) -> None:
        if (event := self._events.get(key)) is not None:
            self._set(key, event)

    def wake_kind(self, prefix: tuple[Hashable, ...]) -> None:
        """Wake every loop whose key begins with ``prefix`` (every object of one resource)."""
        n = len(prefix)
        for key, event in self._events.items():
            if isinstance(key, tuple) and key[:n] == prefix:
                self._set(key, event)

    def wake_all(self) -> None:
        for key, event in self._events.items():
            self._set(key, event)

    def waited(self, key: Hashable) -> float:
        """Seconds since ``key`` was first woken after its event was last cleared."""
        event = self._events.get(key)
        return self._clock() - self._first[key] if event and event.is_set() else 0.0

    def _set(self, key: Hashable, event: asyncio.Event) -> None:
        if not event.is_set():
            self._first[key] = self._clock()
        event.set()


@dataclass(frozen=True)
class InformerSpec:
    """An informer a controller wants: its list call (made from the client once there
    is one), projection, server-side selector, and who hears of its changes."""

    name: str
    lister: Callable[[ApiHttp], Lister]
    view: Callable[[Mapping[str, Any]], Any]
    label_selector: str
    subscriber: Subscriber[Any]
    forget: Callable[[], None]
    """Drop what the subscriber built (the informer stopped)."""
    field_selector: str = ""

    @classmethod
    def indexed(
        cls,
        name: str,
        lister: Callable[[ApiHttp], Lister],
        label_selector: str,
        view: Callable[[Mapping[str, Any]], tuple[G, Any]],
        index: OwnedIndex[G, Any],
        wake: Callable[[G], None],
        field_selector: str = "",
    ) -> InformerSpec:
        """An informer whose views fill ``index`` by group; ``wake`` hears of each group a
        change touched."""

        def changed(changes: Sequence[Change[tuple[G, Any]]]) -> None:
            for group in index.apply(changes):
                wake(group)

        return cls(name, lister, view, label_selector, changed, index.clear, field_selector)


@dataclass
class Shared:
    kube: Kube
    operator_namespace: str
    settings: Mapping[str, str] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    node_objects: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each node as ``slim_node`` keeps it (Node-shaped): for event references, the
    rollout and its hooks. Replaced whole when a relist lands."""
    crd_groups: dict[str, str] = field(default_factory=dict)
    """CRD name -> API group, for every CRD the apiserver has."""
    builtin_groups: frozenset[str] = frozenset()
    """Groups the apiserver serves itself (resource.k8s.io, ...), read at start-up."""
    wakeups: Wakeups = field(default_factory=Wakeups)
    nodes_synced: bool = False
    """Every informer's cache (the nodes', and those added with ``watch``) holds a full
    listing: only then may a pass run. A pass on a cache still filling would take
    the nodes (or pods) it misses for ones that are gone."""
    async_api: Callable[[], Awaitable[ApiHttp]] = api_client
    """Makes the informers' client (in the operator's event loop)."""
    watches: list[InformerSpec] = field(default_factory=list)
    informers: list[Informer[Any]] = field(default_factory=list)
    _informer_api: ApiHttp | None = None
    _syncing: asyncio.Task[None] | None = None

    def forget(self) -> None:
        """Drop what kopf's watches said; they list everything again on restart.
        The informers run on across kopf's in-process restarts."""
        self.crd_groups.clear()

    def watch(self, spec: InformerSpec) -> None:
        """Run an informer for ``spec`` next to the node informer (register before start)."""
        self.watches.append(spec)

    def nodes_changed(self, changes: Sequence[Change[dict[str, Any]]]) -> None:
        """Apply the informer's changes; wake the loops when a node's NodeView moved.

        A relist's difference is applied to copies that then replace the dicts,
        so a pass reading them from its thread sees one listing or the other.
        """
        whole = len(changes) > 1
        nodes = dict(self.nodes) if whole else self.nodes
        objects = dict(self.node_objects) if whole else self.node_objects
        moved: list[tuple[NodeView | None, NodeView | None]] = []
        for change in changes:
            name = change.key[1]
            old = nodes.get(name)
            if change.new is None:
                objects.pop(name, None)
                nodes.pop(name, None)
                view = None
            else:
                objects[name] = change.new
                view = nodes[name] = node_view(change.new)
            if view != old:
                moved.append((old, view))
        if whole:
            self.nodes, self.node_objects = nodes, objects
        if moved and self.nodes_synced:  # heartbeats change nothing a plan reads
            self.wakeups.wake_for_nodes(moved)

    async def start_informers(self) -> None:
        """Start the informers, not waiting for their lists: ``nodes_synced`` is set, and
        every loop woken, once they have all landed."""
        if self.informers:
            return  # kopf restarted in-process: the informers kept their watches
        api = self._informer_api = await self.async_api()
        nodes: Informer[dict[str, Any]] = Informer(
            "nodes", kind_lister("", "v1", "nodes")(api), view=slim_node
        )
        nodes.subscribe(self.nodes_changed)
        self.informers = [nodes]
        for spec in self.watches:
            informer: Informer[Any] = Informer(
                spec.name,
                spec.lister(api),
                view=spec.view,
                label_selector=spec.label_selector,
                field_selector=spec.field_selector,
            )
            informer.subscribe(spec.subscriber)
            self.informers.append(informer)
        for informer in self.informers:
            informer.start()
        self._syncing = asyncio.create_task(self._when_synced(self.informers))

    async def _when_synced(self, informers: list[Informer[Any]]) -> None:
        started = time.monotonic()
        for informer in informers:
            await informer.synced.wait()
        self.nodes_synced = True
        log.info(
            "caches filled in %.1fs: %d nodes, %d informers",
            time.monotonic() - started,
            len(self.nodes),
            len(informers),
        )
        self.wakeups.wake_all()

    async def stop_informers(self) -> None:
        informers, self.informers = self.informers, []
        self.nodes_synced = False
        if self._syncing is not None:
            self._syncing.cancel()
            self._syncing = None
        for informer in informers:
            await informer.stop()
        if self._informer_api is not None:
            await self._informer_api.aclose()
            self._informer_api = None
        self.nodes, self.node_objects = {}, {}
        for spec in self.watches:
            spec.forget()

    @property
    def api_groups(self) -> frozenset[str]:
        return self.builtin_groups | frozenset(self.crd_groups.values())

    def register(self, registry: kopf.OperatorRegistry) -> None:
        @kopf.on.startup(registry=registry)
        def discover_groups(**_: Any) -> None:
            apis: Any = client.ApisApi(self.kube.api)
            ext: Any = client.ApiextensionsV1Api(self.kube.api)
            served = {g.name for g in apis.get_api_versions().groups}
            crds = {
                c.metadata.name: c.spec.group for c in ext.list_custom_resource_definition().items
            }
            self.builtin_groups = frozenset(served - set(crds.values()))
            # CRD groups come and go with their CRDs; the watch below tracks them. Known from
            # the start too: a first pass that ran before the watch's first events would take
            # a served group (upstream KMM's, say) for one not served.
            self.crd_groups.update(crds)

        @kopf.on.cleanup(registry=registry)
        async def stop_nodes(**_: Any) -> None:
            await self.stop_informers()

        @kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", registry=registry)
        async def crd_event(type: str, body: kopf.Body, name: str, **_: Any) -> None:
            group = None if type == "DELETED" else str((body.get("spec") or {}).get("group", ""))
            self.crd_changed(name, group)

    def crd_changed(self, name: str, group: str | None) -> None:
        """The CRD ``name`` now serves ``group`` (None: it was deleted).

        Installing or removing upstream KMM (or any CRD a backend looks for) takes effect
        at once, without restarting the operator."""
        before = self.api_groups
        if group is None:
            self.crd_groups.pop(name, None)
        else:
            self.crd_groups[name] = group
        # An informer of a kind not served yet may be waiting out its longest backoff;
        # the CRD's events (created, then established) make it look now.
        for informer in self.informers:
            informer.look_again()
        if self.api_groups != before:
            self.wakeups.wake_all()
