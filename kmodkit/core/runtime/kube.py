"""Thin, idempotent writes to the API server; the only place the engine mutates.

Creating what exists and deleting what is gone are successes, so applying the
same plan twice changes nothing and a restarted operator can replay its last
pass without harm.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from kmodkit.core.events import Recorder
from kmodkit.core.labels import FIELD_MANAGER
from kmodkit.core.runtime.writes import Throttle, WritePool, WriteSettings
from kmodkit.core.sending import send

log = logging.getLogger("kmodkit.kube")


def api_message(err: BaseException) -> str:
    """What the API server said when it refused a call (admission, quota, a webhook):
    the Status object's message, which names the object and the rule."""
    body = getattr(err, "body", None)
    if isinstance(body, bytes | str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            status = None
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    reason = getattr(err, "reason", None)
    return str(reason) if isinstance(reason, str) and reason else str(err)


@dataclass(frozen=True)
class _Groups:
    """The client's API groups. Bodies are plain dicts (as planned), which the client
    accepts but its stubs do not describe; the typed surface of Kube is the contract."""

    core: Any
    batch: Any
    apps: Any
    custom: Any
    events: Recorder
    """Posts Events, deduplicated (see kmodkit.core.events)."""

    @classmethod
    def of(cls, api: client.ApiClient) -> _Groups:
        core = client.CoreV1Api(api)
        batch, apps = client.BatchV1Api(api), client.AppsV1Api(api)
        return cls(core, batch, apps, client.CustomObjectsApi(api), Recorder(core))


class Kube:
    """The API calls the engine makes, on one ApiClient."""

    def __init__(self, api: client.ApiClient, writes: WriteSettings | None = None) -> None:
        settings = writes or WriteSettings.from_env()
        # Every request of this client is paced and waits out APF's throttling; the
        # engine's passes hand their independent writes to one pool, bounded in all.
        Throttle(settings).install(api)
        self.api = api
        self.writes = WritePool(settings.max_in_flight, api_message)
        # Made on first use: importing the groups' modules takes about a second of CPU
        # (each API call is wrapped in a pydantic validator), which an operator's start
        # spends while its informers list the fleet (``warm``), not before.
        self._groups: _Groups | None = None
        self._making = threading.Lock()
        self._dynamic: Any = None
        self._discovery = threading.Lock()

    def warm(self) -> None:
        """Make the API groups' clients now, so that the first pass finds them made."""
        self._made()

    def _made(self) -> _Groups:
        with self._making:
            if self._groups is None:
                self._groups = _Groups.of(self.api)
            return self._groups

    @property
    def core(self) -> Any:
        return self._made().core

    @property
    def batch(self) -> Any:
        return self._made().batch

    @property
    def apps(self) -> Any:
        return self._made().apps

    @property
    def custom(self) -> Any:
        return self._made().custom

    @property
    def events(self) -> Recorder:
        return self._made().events

    def resource(self, api_version: str, kind: str) -> Any:
        """The dynamic client's resource for a kind (to apply or delete any object).

        One client, so the API is discovered once for the process. Its lookups are made one
        at a time: passes run in threads of their own, and the dynamic client's discovery is
        not thread-safe (a lookup that misses, for a kind served since the last one, rebuilds
        its cache in place, and a lookup meanwhile fails with KeyError 'resources': seen with
        two ClusterPolicies created together)."""
        with self._discovery:
            if self._dynamic is None:
                untyped: Any = dynamic  # the dynamic client has no type hints
                self._dynamic = untyped.DynamicClient(self.api)
            return self._dynamic.resources.get(api_version=api_version, kind=kind)

    def create(self, obj: Mapping[str, Any]) -> None:
        ns = obj["metadata"]["namespace"]
        try:
            if obj["kind"] == "Pod":
                send(self.core.create_namespaced_pod, ns, obj, field_manager=FIELD_MANAGER)
            elif obj["kind"] == "Job":
                send(self.batch.create_namespaced_job, ns, obj, field_manager=FIELD_MANAGER)
            else:
                raise ValueError(f"cannot create a {obj['kind']}")
        except ApiException as e:
            if e.status != 409:
                raise

    def delete_pod(self, namespace: str, name: str) -> None:
        try:
            send(self.core.delete_namespaced_pod, name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def apply_daemon_set(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply: the DaemonSet becomes exactly what is given (fields of ours
        that are gone from it are removed)."""
        meta = obj["metadata"]
        send(
            self.apps.patch_namespaced_daemon_set,
            meta["name"],
            meta["namespace"],
            obj,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    def delete_daemon_set(self, namespace: str, name: str) -> None:
        try:
            send(self.apps.delete_namespaced_daemon_set, name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            send(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        try:
            send(
                self.batch.patch_namespaced_job,
                name,
                namespace,
                {"metadata": {"annotations": dict(annotations)}},
                field_manager=FIELD_MANAGER,
            )
        except ApiException as e:
            if e.status != 404:  # deleted meanwhile
                raise

    def label_node(self, node: str, change: Mapping[str, str | None]) -> None:
        """Merge-patch labels: a value sets, None removes."""
        try:
            send(
                self.core.patch_node,
                node,
                {"metadata": {"labels": dict(change)}},
                field_manager=FIELD_MANAGER,
            )
        except ApiException as e:
            if e.status != 404:  # the node went away; nothing to label
                raise

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        resp = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )

        return list(json.loads(resp.data).get("items", []))

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(secret.data or {})

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            config_map = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(config_map.data or {})

    def write_status(
        self,
        group: str,
        version: str,
        plural: str,
        body: Mapping[str, Any],
        status: Mapping[str, Any],
    ) -> None:
        """Merge-patch ``status`` onto the object ``body`` unless it already says exactly that.

        Idle after convergence means zero writes: a pass that changes nothing
        writes nothing. Only the keys given are compared and written; others stay.
        """
        old = body.get("status") or {}
        if {k: v for k, v in old.items() if k in status} == dict(status):
            return
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace"), str(meta.get("name", ""))
        patch = {"status": dict(status)}
        try:
            if namespace:
                send(
                    self.custom.patch_namespaced_custom_object_status,
                    group,
                    version,
                    namespace,
                    plural,
                    name,
                    patch,
                    field_manager=FIELD_MANAGER,
                )
            else:
                send(
                    self.custom.patch_cluster_custom_object_status,
                    group,
                    version,
                    plural,
                    name,
                    patch,
                    field_manager=FIELD_MANAGER,
                )
        except ApiException as e:
            if e.status != 404:  # deleted meanwhile
                raise
