"""The ClusterPolicy CRD and its admission policy in a real apiserver.

Every invalid policy of tests/unit/backends/intel_xe/cluster_policy_cases.py that a CEL
rule catches is sent to the apiserver, which must refuse it with the rule's own
message (naming the field); the name-length admission policy is sent a name that
fits the CRD's bound but not the labelled operator namespace's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.backends.intel_xe import api
from kmodkit.backends.intel_xe.crd import OPERATOR_NAMESPACE_LABEL
from kmodkit.sdk import MAX_NAME_AND_NAMESPACE
from kmodkit_dev.waiting import wait_gone, wait_until
from tests.integration.crds_util import install
from tests.unit.backends.intel_xe.cluster_policy_cases import (
    MAPPING_CASES,
    SPEC_CASES,
    Case,
    kernel_module,
)

pytestmark = pytest.mark.cluster

ADMITTED = [c for c in [*SPEC_CASES, *MAPPING_CASES] if c.admission is not None]


@pytest.fixture(scope="module")
def objects(kube_api: client.ApiClient) -> client.CustomObjectsApi:
    install(kube_api)
    return client.CustomObjectsApi(kube_api)


def _policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"resourceRegistration": "dp", **spec},
    }


def _refusal(objects: client.CustomObjectsApi, body: dict[str, Any]) -> str | None:
    """The apiserver's message refusing a (dry-run) create of ``body``; None if accepted."""
    try:
        objects.create_cluster_custom_object(
            api.GROUP, api.VERSION, api.PLURAL, body, dry_run="All"
        )
    except ApiException as err:
        assert err.status == 422, err.body
        return str(json.loads(err.body)["message"])
    return None


def test_a_valid_policy_is_accepted(objects: client.CustomObjectsApi) -> None:
    assert _refusal(objects, _policy("valid", kernelModule=kernel_module())) is None


@pytest.mark.parametrize("case", ADMITTED, ids=lambda c: c.id)
def test_every_rule_refuses_naming_its_field(objects: client.CustomObjectsApi, case: Case) -> None:
    message = _refusal(objects, _policy(f"bad-{case.id}", **case.spec))
    assert message is not None, f"the apiserver accepted {case.spec}"
    assert case.admission is not None and case.admission in message, message


@pytest.fixture
def operator_namespace(kube_api: client.ApiClient) -> Iterator[str]:
    """A namespace labelled as the operator's, with a long name."""
    name = f"long-operator-namespace-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(
        {"metadata": {"name": name, "labels": {OPERATOR_NAMESPACE_LABEL: "true"}}}
    )
    yield name
    core.delete_namespace(name)

    # While it exists, every policy name is checked against it.
    wait_gone(lambda: core.read_namespace(name), "the labelled namespace")


def test_the_name_must_fit_the_labelled_operator_namespace(
    objects: client.CustomObjectsApi, operator_namespace: str
) -> None:
    # Within the CRD's own bound, but with -gpu and this namespace over KMM's limit.
    name = "a" * (MAX_NAME_AND_NAMESPACE - len(api.MODULE_SUFFIX) - len(operator_namespace) + 1)
    assert len(name) <= api.MAX_NAME_LENGTH
    message = wait_until(
        lambda: _refusal(objects, _policy(name)),
        "the name-length admission policy to take effect",
        timeout=30,
    )
    total = len(name) + len(api.MODULE_SUFFIX) + len(operator_namespace)
    assert f"metadata.name: {api.POLICY_NAME_LENGTH_MSG}" in message
    assert f"in namespace {operator_namespace} totals {total}" in message
