"""Installing kmodkit's generated manifests into a real apiserver, for tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

CRDS_DIR = Path(__file__).resolve().parents[2] / "crds"
FIELD_MANAGER = "kmodkit-tests"
APPLY = "application/apply-patch+yaml"

T = TypeVar("T")


def manifests() -> list[dict[str, Any]]:
    """Every document in crds/, CRDs first so policies can refer to their resources."""
    docs = [
        doc
        for path in sorted(CRDS_DIR.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]
    return sorted(docs, key=lambda doc: doc["kind"] != "CustomResourceDefinition")


def apply(api: client.ApiClient, doc: dict[str, Any]) -> None:
    """Server-side apply one generated manifest."""
    name = doc["metadata"]["name"]
    options: dict[str, Any] = {
        "field_manager": FIELD_MANAGER,
        "force": True,
        "_content_type": APPLY,
    }
    kind = doc["kind"]
    if kind == "CustomResourceDefinition":
        client.ApiextensionsV1Api(api).patch_custom_resource_definition(name, doc, **options)
    elif kind == "ValidatingAdmissionPolicy":
        client.AdmissionregistrationV1Api(api).patch_validating_admission_policy(
            name, doc, **options
        )
    elif kind == "ValidatingAdmissionPolicyBinding":
        client.AdmissionregistrationV1Api(api).patch_validating_admission_policy_binding(
            name, doc, **options
        )
    else:
        raise ValueError(f"crds/ holds a {kind}, which this helper cannot install")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll ``check`` until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def wait_established(api: client.ApiClient, name: str) -> None:
    """Wait until the CRD is Established and its resource is served."""
    extensions = client.ApiextensionsV1Api(api)

    def established() -> bool | None:
        crd = extensions.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        return True if conditions.get("Established") == "True" else None

    wait_for(f"CRD {name} to be Established", established)
    crd = extensions.read_custom_resource_definition(name)
    group, plural = crd.spec.group, crd.spec.names.plural
    version = crd.spec.versions[0].name
    objects = client.CustomObjectsApi(api)

    def served() -> bool | None:
        # Established comes slightly before discovery and the handler serve it.
        try:
            objects.list_cluster_custom_object(group, version, plural, limit=1)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return True

    wait_for(f"{plural}.{group} to be served", served)


def install(api: client.ApiClient) -> None:
    """Install everything in crds/ and wait until the CRDs are served."""
    docs = manifests()
    for doc in docs:
        apply(api, doc)
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            wait_established(api, doc["metadata"]["name"])
