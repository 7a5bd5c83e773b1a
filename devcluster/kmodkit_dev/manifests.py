"""Installing generated manifests (CRDs and their admission policies) into an apiserver.

Used by the demo, the benchmarks and the tests; applying is idempotent
(server-side apply), and ``install`` returns once every CRD is served.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit_dev.waiting import wait_until

FIELD_MANAGER = "kmodkit-devcluster"
APPLY = "application/apply-patch+yaml"


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
        raise ValueError(f"cannot install a {kind}: only CRDs and admission policies")


def wait_established(api: client.ApiClient, name: str) -> None:
    """Wait until the CRD is Established and its resource is served."""
    extensions: Any = client.ApiextensionsV1Api(api)

    def established() -> bool | None:
        crd = extensions.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        return True if conditions.get("Established") == "True" else None

    wait_until(established, f"CRD {name} to be Established")
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

    wait_until(served, f"{plural}.{group} to be served")


def install(api: client.ApiClient, documents: Iterable[dict[str, Any]]) -> None:
    """Apply ``documents`` (CRDs first) and wait until every CRD is served."""
    docs = sorted(documents, key=lambda doc: doc["kind"] != "CustomResourceDefinition")
    for doc in docs:
        apply(api, doc)
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            wait_established(api, doc["metadata"]["name"])


def uninstall_crds(api: client.ApiClient, crds: Iterable[dict[str, Any]]) -> None:
    """Delete ``crds`` (and with them every object of theirs) and wait until they are gone."""
    extensions: Any = client.ApiextensionsV1Api(api)
    names = {crd["metadata"]["name"] for crd in crds}
    for name in names:
        try:
            extensions.delete_custom_resource_definition(name)
        except ApiException as err:
            if err.status != 404:
                raise

    def gone() -> bool:
        served = {c.metadata.name for c in extensions.list_custom_resource_definition().items}
        return not names & served

    wait_until(gone, f"{', '.join(sorted(names))} to be deleted")
