"""The runtime side of the backend contract: one controller per backend resource.

For every object of the resource a daemon runs the backend's pure plan on
what the watches saw, server-side applies the planned objects (labelled and
owner-referenced to the object, so the controller-manager collects them with
it), prunes owned objects no longer planned, runs a rollout pass when the plan
asks for one, and writes the status when it changed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf
from kubernetes.dynamic.exceptions import NotFoundError

from kmodkit.core import labels
from kmodkit.core.applied import holds, stamped
from kmodkit.core.contract.backend import (
    ApplyFailure,
    ClusterView,
    OwnedKind,
    Plan,
    Resource,
    Watch,
)
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.engine.node_interest import label_interest
from kmodkit.core.events import CONDITION_REPEAT_SECONDS, node_reference
from kmodkit.core.owners import controller_reference
from kmodkit.core.rollout.abandon import abandon
from kmodkit.core.rollout.keys import ROLLOUT_PREFIX
from kmodkit.core.rollout.reconcile import reconcile as rollout_pass
from kmodkit.core.runtime import metrics
from kmodkit.core.runtime.informer import kind_lister
from kmodkit.core.runtime.informer_cache import kept_whole
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.loop import reconcile_loop
from kmodkit.core.runtime.owned_index import OwnedIndex
from kmodkit.core.runtime.watch_cache import CACHE_WAIT_SECONDS, InformerSpec, Shared
from kmodkit.core.runtime.writes import Write

log = logging.getLogger("kmodkit.controller")

OWNER_UID_LABEL = f"{labels.KMODKIT_PREFIX}/owner-uid"
ROLLOUT_LABELS = f"{ROLLOUT_PREFIX}/"
RETRY_FAILED_APPLY = 30.0
DELETION_RECHECK_SECONDS = 10.0
"""On every object a backend plan produced: the uid of the object that owns it."""


def _identity(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (
        str(obj.get("apiVersion")),
        str(obj.get("kind")),
        str(meta.get("namespace") or ""),
        str(meta.get("name")),
    )


def watched_view(watch: Watch, obj: Obj) -> dict[str, Any]:
    """What the cache of ``watch`` keeps of ``obj``: the fields it names, less managedFields,
    strings interned (plan tests and benches read their fixtures through it too)."""
    return kept_whole(watch.kept(obj))


def _policy_name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)


class ResourceController:
    def __init__(
        self, backend: str, resource: Resource, shared: Shared, resync_seconds: float = 300.0
    ) -> None:
        self.backend = backend
        self.resource = resource
        self.shared = shared
        self.resync_seconds = resync_seconds
        self._watched_objects: dict[str, OwnedIndex[None, Obj]] = {}
        """Per watch of the backend's, what its informer holds."""
        self._owned_objects: list[OwnedIndex[str, Obj]] = []
        """Per kind the backend owns, what its informer holds, by owner uid."""
        self._watched_changes = 0
        """Changes the watches delivered so far: what a node-label predicate was made from."""

    @property
    def _id(self) -> str:
        return f"{self.backend}.{self.resource.crd.plural}"

    def register(self, registry: kopf.OperatorRegistry) -> None:
        crd = self.resource.crd
        wakeups = self.shared.wakeups
        kind_key = ("backend", crd.group, crd.plural)

        # A backend's watches may be fleet-sized (its pods on every node, a claim per
        # workload): informers, with the labels as a server-side selector, not kopf.
        for w in self.resource.watches:
            self.shared.watch(self._watch_spec(w, f"{self._id}.watch.{w.name}", kind_key))
        # What it owns is few objects, but of kinds every cluster has many of (ConfigMaps,
        # DaemonSets): only those carrying an owner's uid are sent.
        for owned in self.resource.owns:
            self.shared.watch(
                self._owned_spec(owned, f"{self._id}.owned.{owned.kind.lower()}", kind_key)
            )

        @kopf.on.event(
            crd.group, crd.version, crd.plural, id=f"{self._id}.event", registry=registry
        )
        async def changed(uid: str, **_: Any) -> None:
            wakeups.wake((*kind_key, uid))

        @kopf.daemon(
            crd.group,
            crd.version,
            crd.plural,
            id=f"{self._id}.daemon",
            registry=registry,
            cancellation_timeout=30,
        )
        async def daemon(uid: str, body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
            def one_pass() -> float | None:
                return self.reconcile(dict(body), self._watched(), self._owned(uid))

            if (reads := self._node_labels(body)) is not None:
                wakeups.interest((*kind_key, uid), label_interest(reads))
            try:
                await reconcile_loop(
                    (*kind_key, uid),
                    metrics.instrumented(self._id, _policy_name(body), one_pass),
                    stopped,
                    wakeups,
                    self.resync_seconds,
                )
            finally:
                metrics.forget(self._id, _policy_name(body))

        if self.resource.hooks is not None or self.resource.hold_deletion is not None:

            @kopf.on.delete(
                crd.group, crd.version, crd.plural, id=f"{self._id}.finalize", registry=registry
            )
            def finalize(uid: str, body: kopf.Body, **_: Any) -> None:
                if not self.shared.nodes_synced:
                    raise kopf.TemporaryError(
                        "waiting for the node cache to fill", delay=CACHE_WAIT_SECONDS
                    )
                watched = self._watched()
                if self.resource.hold_deletion is not None:
                    held = self.resource.hold_deletion(
                        dict(body), self._view(watched, self._owned(uid)), self.shared.kube.api
                    )
                    if held is not None:
                        self._write_status(dict(body), dict(held))
                        why = "; ".join(held.get("errors") or []) or "the backend holds it"
                        raise kopf.TemporaryError(
                            f"deletion waits: {why}", delay=DELETION_RECHECK_SECONDS
                        )
                if self.resource.hooks is None:
                    return
                # A rollout must never leave a node cordoned because its policy went away:
                # every node it marked, also one no longer targeted (held after failing
                # there, or whose release a pass had not landed yet).
                plan = self.resource.plan(dict(body), self._view(watched, []))
                if plan.rollout is not None:
                    abandon(
                        self.shared.kube.api,
                        plan.rollout.policy_id,
                        list(self.shared.node_objects.values()),
                    )

    def _watch_spec(self, w: Watch, name: str, kind_key: tuple[str, str, str]) -> InformerSpec:
        index: OwnedIndex[None, Obj] = OwnedIndex()
        self._watched_objects[w.name] = index
        return InformerSpec.indexed(
            name,
            kind_lister(w.group, w.version, w.plural),
            ",".join(f"{k}={v}" for k, v in sorted(w.labels.items())),
            lambda obj: (None, watched_view(w, obj)),
            index,
            lambda _: self._watch_changed(w, kind_key),
            w.field_selector,
        )

    def _watch_changed(self, w: Watch, kind_key: tuple[str, str, str]) -> None:
        self._watched_changes += 1
        if w.wakes:
            # Only this resource's plans read its watches: another controller's loops (a
            # Module's pass over 10,000 nodes) are not woken by its pods.
            self.shared.wakeups.wake_kind(kind_key)

    def _owned_spec(
        self, owned: OwnedKind, name: str, kind_key: tuple[str, str, str]
    ) -> InformerSpec:
        index: OwnedIndex[str, Obj] = OwnedIndex()
        self._owned_objects.append(index)
        wakeups = self.shared.wakeups
        group, _, version = owned.api_version.rpartition("/")
        return InformerSpec.indexed(
            name,
            kind_lister(group, version, owned.plural),
            OWNER_UID_LABEL,
            lambda obj: (
                str(((obj.get("metadata") or {}).get("labels") or {})[OWNER_UID_LABEL]),
                kept_whole(obj),
            ),
            index,
            lambda uid: wakeups.wake((*kind_key, uid)),
        )

    def _node_labels(self, body: kopf.Body) -> Callable[[], Callable[[str], bool]] | None:
        """The node labels the object's passes read, as it is now (None: every change)."""
        declared = self.resource.node_labels
        if declared is None:
            return None
        # The rollout reads and writes its own labels on the nodes of every backend.
        rollout = self.resource.hooks is not None
        made: dict[tuple[Any, int], Callable[[str], bool]] = {}

        def reads() -> Callable[[str], bool]:
            # Asked at each batch of node changes (one a node event): made again only once
            # the object or what its watches hold moved, not from 10,000 pods each time.
            stamp = ((body.get("metadata") or {}).get("resourceVersion"), self._watched_changes)
            if stamp not in made:
                named = declared(dict(body), self._watched())
                made.clear()
                made[stamp] = (
                    (lambda key: key.startswith(ROLLOUT_LABELS) or named(key)) if rollout else named
                )
            return made[stamp]

        return reads

    def _owned(self, uid: str) -> list[Obj]:
        return [o for index in self._owned_objects for o in index.get(uid)]

    def _watched(self) -> dict[str, list[Obj]]:
        return {name: index.get(None) for name, index in self._watched_objects.items()}

    def _view(self, watched: Mapping[str, Sequence[Obj]], owned: Sequence[Obj]) -> ClusterView:
        return ClusterView(
            nodes=list(self.shared.nodes.values()),
            api_groups=self.shared.api_groups,
            operator_namespace=self.shared.operator_namespace,
            watched=watched,
            owned=owned,
            settings=self.shared.settings,
        )

    def reconcile(
        self, body: dict[str, Any], watched: Mapping[str, Sequence[Obj]], owned: Sequence[Obj]
    ) -> float | None:
        if not self.shared.nodes_synced:
            return CACHE_WAIT_SECONDS  # a half-filled node cache is not a smaller fleet
        view = self._view(watched, owned)
        plan = self.resource.plan(body, view)
        failed = self._apply(body, plan, owned)
        self._prune(plan, owned)
        status = dict(plan.status)
        if failed and self.resource.apply_failed is not None:
            status = dict(self.resource.apply_failed(body, status, failed))
        if plan.rollout is not None:
            status = self._rollout(body, plan, view, status)
        metrics.degraded(self._id, _policy_name(body), status)
        metrics.summary(self._id, _policy_name(body), status)
        self._write_status(body, status)
        # After the write: the transitions are judged against the status written, so a
        # write that failed has them posted by the pass that writes them.
        self._post_events(body, plan)
        if failed:
            return min(plan.requeue_after or RETRY_FAILED_APPLY, RETRY_FAILED_APPLY)
        return plan.requeue_after

    def _apply(self, owner: Obj, plan: Plan, owned: Sequence[Obj]) -> list[ApplyFailure]:
        """Apply every planned object the cache (``owned``) does not show as it would be
        applied; one the apiserver refuses does not stop the others.

        Refusals are logged and posted as a Warning event on the owner, naming
        the object and the apiserver's reason, and returned.
        """
        failed = []
        meta = owner.get("metadata") or {}
        ref = controller_reference(owner)
        live = {_identity(o): o for o in owned}
        for obj in plan.objects:
            body = dict(obj)
            obj_meta = dict(body.get("metadata") or {})
            obj_meta["labels"] = {
                **(obj_meta.get("labels") or {}),
                labels.MANAGED_BY_LABEL: labels.MANAGED_BY,
                OWNER_UID_LABEL: str(meta.get("uid")),
            }
            obj_meta["ownerReferences"] = [ref]
            body["metadata"] = obj_meta
            body = stamped(body)
            if holds(live.get(_identity(body)), body):
                continue  # no write for what the object already holds
            try:
                self._resource_for(body).server_side_apply(
                    body=body,
                    field_manager=labels.FIELD_MANAGER,
                    force_conflicts=True,
                    namespace=obj_meta.get("namespace"),
                )
            except Exception as err:  # the dynamic client raises several unrelated types
                what = (
                    f"{body.get('kind')} {obj_meta.get('namespace') or ''}/{obj_meta.get('name')}"
                )
                reason = api_message(err)
                failed.append(
                    ApplyFailure(
                        str(body.get("apiVersion")),
                        str(body.get("kind")),
                        str(obj_meta.get("namespace") or ""),
                        str(obj_meta.get("name")),
                        reason,
                    )
                )
                log.warning(
                    "applying %s for %s %s failed: %s",
                    what,
                    owner.get("kind"),
                    meta.get("name"),
                    reason,
                )
                self.shared.kube.events.post(
                    {
                        "apiVersion": owner.get("apiVersion"),
                        "kind": owner.get("kind"),
                        "name": meta.get("name"),
                        "uid": meta.get("uid"),
                        "namespace": meta.get("namespace"),
                    },
                    "ApplyFailed",
                    f"{what}: {reason}",
                    warning=True,
                    repeat_after=CONDITION_REPEAT_SECONDS,
                )
        return failed

    def _post_events(self, owner: Obj, plan: Plan) -> None:
        """One Event per node transition, on the node and on the owner (folded by the
        recorder when many nodes move at once)."""
        meta = owner.get("metadata") or {}
        ref = {
            "apiVersion": owner.get("apiVersion"),
            "kind": owner.get("kind"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "namespace": meta.get("namespace"),
        }
        for ev in plan.events:
            node = self.shared.node_objects.get(ev.node)
            message = f"node {ev.node}: {ev.message}" if ev.message else f"node {ev.node}"
            for involved in [*([node_reference(node)] if node else []), ref]:
                self.shared.kube.events.post(involved, ev.reason, message, warning=ev.warning)

    def _prune(self, plan: Plan, owned: Sequence[Obj]) -> None:
        wanted = {_identity(o) for o in plan.objects}
        for obj in owned:
            if _identity(obj) in wanted:
                continue
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue
            with contextlib.suppress(NotFoundError):
                self._resource_for(obj).delete(
                    name=meta.get("name"), namespace=meta.get("namespace")
                )

    def _resource_for(self, obj: Obj) -> Any:
        return self.shared.kube.resource(str(obj["apiVersion"]), str(obj["kind"]))

    def _rollout(
        self, body: Obj, plan: Plan, view: ClusterView, status: dict[str, Any]
    ) -> dict[str, Any]:
        request = plan.rollout
        assert request is not None and self.resource.hooks is not None
        hooks = self.resource.hooks(body, view, self.shared.kube.api)
        meta = body.get("metadata") or {}
        objects = self.shared.node_objects  # one listing, should a relist swap it mid-pass
        result = rollout_pass(
            self.shared.kube.api,
            request.policy_id,
            request.policy,
            [o for n in request.nodes if (o := objects.get(n)) is not None],
            hooks,
            target=request.target,
            paused=request.paused,
            skip_label=request.skip_label,
            involved={
                "apiVersion": str(body.get("apiVersion")),
                "kind": str(body.get("kind")),
                "name": str(meta.get("name")),
                "namespace": str(meta.get("namespace") or ""),
                "uid": str(meta.get("uid")),
            },
            known_nodes=list(objects.values()),
            concurrently=self._alongside,
        )
        metrics.rollout_pass(self._id, _policy_name(body), result)
        if self.resource.rollout_status is not None:
            return dict(self.resource.rollout_status(status, result))
        return status

    def _alongside(self, calls: Sequence[Callable[[], None]]) -> None:
        """A rollout pass's steps, in the process's write pool (its bound on writes in
        flight); each step reports its own errors."""
        self.shared.kube.writes.run(Write("a rollout step", call) for call in calls)

    def _write_status(self, body: Obj, status: Mapping[str, Any]) -> None:
        crd = self.resource.crd
        self.shared.kube.write_status(crd.group, crd.version, crd.plural, body, status)
