"""The plugin's reads and writes: one request each, errors turned into sentences."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from kmodkit.core.cli.kubectl.kinds import Kind, kinds_named
from kmodkit.core.cli.kubectl.rows import Row, row
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.schema.crd import CrdSource

MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "kubectl-kmodkit"
"""Field manager of the verbs' patches, so managedFields say who changed what."""
# Upstream KMM's Module, for ordered upgrades of Modules KMM serves.
KMM_MODULE = ("kmm.sigs.x-k8s.io", "v1beta1", "modules")


def client(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import config

    untyped: Any = config
    return untyped.new_client_from_config(config_file=kubeconfig, context=context)


def _objects(api: Any) -> Any:
    from kubernetes import client as k8s

    return k8s.CustomObjectsApi(api)


def _core(api: Any) -> Any:
    from kubernetes import client as k8s

    return k8s.CoreV1Api(api)


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


def _missing(err: Exception) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(err, ApiException) and err.status == 404


def list_objects(api: Any, crd: CrdSource, namespace: str | None) -> list[Obj] | None:
    """Every object of ``crd`` (None when the cluster does not serve it)."""
    objects = _objects(api)
    try:
        if crd.namespaced and namespace:
            resp = objects.list_namespaced_custom_object(
                crd.group, crd.version, namespace, crd.plural, _preload_content=False
            )
        else:
            resp = objects.list_cluster_custom_object(
                crd.group, crd.version, crd.plural, _preload_content=False
            )
    except Exception as e:
        if _missing(e):
            return None
        raise
    return list(_json(resp).get("items") or [])


def collect(api: Any, namespace: str | None, known: Sequence[Kind]) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    unserved: list[str] = []
    for kind in known:
        items = list_objects(api, kind.crd, namespace)
        if items is None:
            unserved.append(f"{kind.crd.plural}.{kind.crd.group}")
            continue
        rows += [row(kind, obj) for obj in items]
    return rows, unserved


def find(
    api: Any, known: Sequence[Kind], kind_word: str | None, name: str, namespace: str | None
) -> list[tuple[Kind, Obj]]:
    """Every object named ``name`` of the kinds ``kind_word`` names."""
    objects = _objects(api)
    found: list[tuple[Kind, Obj]] = []
    for kind in kinds_named(kind_word, known):
        c = kind.crd
        try:
            if not c.namespaced:
                resp = objects.get_cluster_custom_object(
                    c.group, c.version, c.plural, name, _preload_content=False
                )
                found.append((kind, _json(resp)))
            elif namespace:
                resp = objects.get_namespaced_custom_object(
                    c.group, c.version, namespace, c.plural, name, _preload_content=False
                )
                found.append((kind, _json(resp)))
            else:
                resp = objects.list_cluster_custom_object(
                    c.group,
                    c.version,
                    c.plural,
                    field_selector=f"metadata.name={name}",
                    _preload_content=False,
                )
                found += [(kind, obj) for obj in _json(resp).get("items") or []]
        except Exception as e:
            if not _missing(e):
                raise
    return found


def read_node(api: Any, name: str) -> Obj:
    try:
        node: Obj = _json(_core(api).read_node(name, _preload_content=False))
    except Exception as e:
        if _missing(e):
            raise click.ClickException(f"no node named {name!r} (kubectl get nodes)") from e
        raise
    return node


def node_events(api: Any, name: str) -> list[Obj]:
    resp = _core(api).list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=Node,involvedObject.name={name}",
        _preload_content=False,
    )
    return list(_json(resp).get("items") or [])


def read_module(api: Any, namespace: str, name: str, module: CrdSource) -> Obj:
    """The kmodkit Module ``namespace/name``, else upstream KMM's of that name."""
    objects = _objects(api)
    for group, version, plural in ((module.group, module.version, module.plural), KMM_MODULE):
        try:
            found: Obj = _json(
                objects.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False
                )
            )
        except Exception as e:
            if _missing(e):
                continue
            raise
        return found
    raise click.ClickException(
        f"no Module {namespace}/{name} (kubectl get modules.{module.group},"
        f"modules.{KMM_MODULE[0]} -n {namespace})"
    )


def patch_node(api: Any, name: str, body: Obj) -> bool:
    """Merge-patch the node; False when its resourceVersion precondition no longer holds."""
    from kubernetes.client.exceptions import ApiException

    try:
        _core(api).patch_node(name, body, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH)
    except ApiException as e:
        if e.status == 409:
            return False
        raise
    return True


def patch_object(api: Any, kind: Kind, obj: Obj, body: Obj) -> None:
    c = kind.crd
    meta = obj.get("metadata") or {}
    objects = _objects(api)
    if c.namespaced:
        objects.patch_namespaced_custom_object(
            c.group,
            c.version,
            meta["namespace"],
            c.plural,
            meta["name"],
            body,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
        )
    else:
        objects.patch_cluster_custom_object(
            c.group,
            c.version,
            c.plural,
            meta["name"],
            body,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
        )
