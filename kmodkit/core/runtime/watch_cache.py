"""Watch caches shared by every controller in the process, and their wake-ups.

These hold what the watches last said (nodes, served API groups) and which
reconcile loops to wake; they are rebuilt from the watch streams after a
restart and never hold progress.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from kmodkit.core.nodes import NodeView, node_view
from kmodkit.core.runtime.kube import Kube

CACHE_WAIT_SECONDS = 1.0
"""How soon a pass that found the node cache still filling tries again."""


class Wakeups:
    """One asyncio.Event per reconcile loop, set when its inputs change."""

    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}

    def event(self, key: Hashable) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def drop(self, key: Hashable) -> None:
        self._events.pop(key, None)

    def wake(self, key: Hashable) -> None:
        if (event := self._events.get(key)) is not None:
            event.set()

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()


@dataclass
class Shared:
    kube: Kube
    operator_namespace: str
    settings: Mapping[str, str] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    raw_nodes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    crd_groups: dict[str, str] = field(default_factory=dict)
    """CRD name -> API group, for every CRD the apiserver has."""
    builtin_groups: frozenset[str] = frozenset()
    """Groups the apiserver serves itself (resource.k8s.io, ...), read at start-up."""
    wakeups: Wakeups = field(default_factory=Wakeups)
    nodes_synced: bool = False
    """The node cache holds every node (a full listing landed): only then may a pass run.
    A pass on a cache still filling would take the nodes it misses for nodes that
    are gone."""

    def forget(self) -> None:
        """Drop what the watches said; they list everything again on restart."""
        self.nodes_synced = False
        self.nodes.clear()
        self.raw_nodes.clear()
        self.crd_groups.clear()

    def sync_nodes(self, page: int = 500) -> None:
        """Fill the node cache from a full listing (in pages), then mark it synced."""
        core: Any = client.CoreV1Api(self.kube.api)
        token: str | None = None
        while True:
            listing = core.list_node(limit=page, _continue=token, _preload_content=False)
            body = json.loads(listing.data)
            for item in body.get("items") or []:
                name = item["metadata"]["name"]
                self.nodes[name] = node_view(item)
                self.raw_nodes[name] = item
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                break
        self.nodes_synced = True
        self.wakeups.wake_all()

    @property
    def api_groups(self) -> frozenset[str]:
        return self.builtin_groups | frozenset(self.crd_groups.values())

    def register(self, registry: kopf.OperatorRegistry) -> None:
        @kopf.on.startup(registry=registry)
        def discover_groups(**_: Any) -> None:
            apis: Any = client.ApisApi(self.kube.api)
            ext: Any = client.ApiextensionsV1Api(self.kube.api)
            served = {g.name for g in apis.get_api_versions().groups}
            # CRD groups come and go with their CRDs; they are tracked by the watch below.
            from_crds = {crd.spec.group for crd in ext.list_custom_resource_definition().items}
            self.builtin_groups = frozenset(served - from_crds)

        @kopf.on.startup(registry=registry)
        def sync_nodes(**_: Any) -> None:
            # Startup handlers finish before any watch or daemon starts, and run
            # again when the watches restart in-process: no pass sees a half cache.
            self.sync_nodes()

        @kopf.on.event("", "v1", "nodes", registry=registry)
        async def node_changed(type: str, body: kopf.Body, name: str, **_: Any) -> None:
            if type == "DELETED":
                self.raw_nodes.pop(name, None)
                changed = self.nodes.pop(name, None) is not None
            else:
                view = node_view(body)
                changed = self.nodes.get(name) != view
                self.nodes[name] = view
                self.raw_nodes[name] = dict(body)
            if changed:  # heartbeats change nothing a plan reads
                self.wakeups.wake_all()

        @kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", registry=registry)
        async def crd_changed(type: str, body: kopf.Body, name: str, **_: Any) -> None:
            # Installing or removing upstream KMM (or any CRD a backend looks
            # for) takes effect at once, without restarting the operator.
            before = self.api_groups
            if type == "DELETED":
                self.crd_groups.pop(name, None)
            else:
                self.crd_groups[name] = str((body.get("spec") or {}).get("group", ""))
            if self.api_groups != before:
                self.wakeups.wake_all()
