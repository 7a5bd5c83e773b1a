"""The generated Module CRD in a real apiserver: bad specs are refused at admission.

Every case the apiserver can catch is sent to it, and the refusal must name
the offending field; valid Modules, including a full KMM-style one, must be
accepted and come back with the CRD's defaults applied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core.api import Module
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.unit.examples import image_from_the_container, kmm_example, kmodkit_example, minimal
from tests.unit.module_cases import CASES, Case

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
C = "spec.moduleLoader.container"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def objects(kube_api: client.ApiClient) -> client.CustomObjectsApi:
    install(kube_api)
    return client.CustomObjectsApi(kube_api)


def _create(objects: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> Any:
    body["metadata"]["namespace"] = namespace
    return objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def _refusal(objects: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> str:
    """The apiserver's message refusing ``body``; fails the test if it is accepted."""
    try:
        _create(objects, namespace, body)
    except ApiException as err:
        assert err.status in (400, 422), err.body
        return str(json.loads(err.body)["message"])
    pytest.fail(f"the apiserver accepted an invalid Module: {body}")


def _kmm_body_as_kmodkit() -> dict[str, Any]:
    body = kmm_example()
    body["apiVersion"] = f"{GROUP}/{VERSION}"
    return body


VALID = {
    "minimal": minimal,
    "full-kmodkit": kmodkit_example,
    "full-kmm-body": _kmm_body_as_kmodkit,
    "mapping-image-from-the-container": image_from_the_container,
}


@pytest.mark.parametrize("make", VALID.values(), ids=list(VALID))
def test_valid_modules_are_accepted(
    objects: client.CustomObjectsApi, namespace: str, make: Callable[[], dict[str, Any]]
) -> None:
    body = make()
    created = _create(objects, namespace, body)
    # What the apiserver stored, with its defaults, is what the model reads
    # from the body with the model's defaults.
    assert Module.model_validate(created).spec == Module.model_validate(body).spec


def test_defaults_are_applied(objects: client.CustomObjectsApi, namespace: str) -> None:
    body = minimal()
    body["spec"]["rollout"] = {}
    created = _create(objects, namespace, body)
    assert created["spec"]["moduleLoader"]["container"]["modprobe"]["dirName"] == "/opt"
    assert created["spec"]["rollout"] == {"maxUnavailable": 1}


@pytest.mark.parametrize("value", [1, 7, "1%", "25%", "100%"])
def test_max_unavailable_accepts_counts_and_percentages(
    objects: client.CustomObjectsApi, namespace: str, value: int | str
) -> None:
    body = minimal()
    body["spec"]["rollout"] = {"maxUnavailable": value}
    assert _create(objects, namespace, body)["spec"]["rollout"]["maxUnavailable"] == value


ADMISSION_CASES = [case for case in CASES if case.admission]


@pytest.mark.parametrize("case", ADMISSION_CASES, ids=[case.id for case in ADMISSION_CASES])
def test_invalid_modules_are_refused_naming_the_field(
    objects: client.CustomObjectsApi, namespace: str, case: Case
) -> None:
    if case.id == "name-and-namespace-too-long":
        message = _policy_refusal(objects, namespace, case.build(namespace))
    else:
        message = _refusal(objects, namespace, case.build(namespace))
    assert f"{case.expected_admission_path}:" in message, message


def _policy_refusal(objects: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> str:
    """Like _refusal, but waits out the admission policy becoming active after install."""

    def refused() -> str | None:
        try:
            _create(objects, namespace, body)
        except ApiException as err:
            assert err.status == 422, err.body
            return str(json.loads(err.body)["message"])
        objects.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body["metadata"]["name"]
        )
        return None

    return wait_until(refused, "the name-length admission policy to take effect", timeout=30)


def test_name_and_namespace_at_the_limit_are_accepted(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    body = minimal()
    body["metadata"]["name"] = "m" * (41 - len(namespace))
    assert _create(objects, namespace, body)["metadata"]["name"] == body["metadata"]["name"]


def _patch_container(
    objects: client.CustomObjectsApi, namespace: str, name: str, container: dict[str, Any]
) -> Any:
    return objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"spec": {"moduleLoader": {"container": container}}},
    )


def test_version_may_change_but_not_appear_or_vanish(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    _create(objects, namespace, minimal(version="v1"))
    _patch_container(objects, namespace, "mod", {"version": "v2"})
    with pytest.raises(ApiException) as err:
        _patch_container(objects, namespace, "mod", {"version": None})
    assert f"{C}.version: " in json.loads(err.value.body)["message"]

    unversioned = minimal()
    unversioned["metadata"]["name"] = "unversioned"
    _create(objects, namespace, unversioned)
    with pytest.raises(ApiException) as err:
        _patch_container(objects, namespace, "unversioned", {"version": "v1"})
    assert f"{C}.version: " in json.loads(err.value.body)["message"]


def _failures(count: int) -> list[dict[str, Any]]:
    return [
        {"node": f"node-{i}", "mappingIndex": 0, "reason": "LoadFailed", "message": "exit 1"}
        for i in range(count)
    ]


def _status(failures: int) -> dict[str, Any]:
    return {
        "status": {
            "moduleLoader": {
                "nodesMatchingSelectorNumber": 60,
                "desiredNumber": 60,
                "availableNumber": 10,
                "readyNumber": 9,
            },
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "LoadFailed",
                    "message": f"{failures} nodes failed to load the module",
                    "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "observedGeneration": 1,
                }
            ],
            "nodeFailures": _failures(failures),
        }
    }


def test_status_subresource_holds_counters_conditions_and_bounded_failures(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    _create(objects, namespace, minimal())
    patched = objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "mod", _status(50)
    )
    assert patched["status"]["moduleLoader"]["readyNumber"] == 9
    assert len(patched["status"]["nodeFailures"]) == 50
    with pytest.raises(ApiException) as err:
        objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "mod", _status(51)
        )
    assert "status.nodeFailures" in json.loads(err.value.body)["message"]


def test_kubectl_columns_and_short_name(
    kube_api: client.ApiClient, objects: client.CustomObjectsApi, namespace: str
) -> None:
    _create(objects, namespace, minimal(version="v3"))
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "mod", _status(0)
    )
    method, url, headers, body, post_params = kube_api.param_serialize(
        "GET",
        f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
        header_params={"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"},
        auth_settings=["BearerToken"],
    )
    response = kube_api.call_api(method, url, headers, body, post_params)
    response.read()
    table = json.loads(response.data)
    assert [column["name"] for column in table["columnDefinitions"]] == [
        "Name",
        "Desired",
        "Available",
        "Ready",
        "Version",
        "Age",
    ]
    assert table["rows"][0]["cells"][:5] == ["mod", 60, 10, 9, "v3"]
    crd = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    assert crd.status.accepted_names.short_names == ["kmod"]
