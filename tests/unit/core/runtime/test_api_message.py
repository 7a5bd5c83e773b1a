"""What a refused write reports: the API server's own message, from either client."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import api_exception

from kmodkit.core.runtime.kube import api_message

REFUSAL = 'pods "xe-loader-n1" is forbidden: exceeded quota: one-pod, requested: pods=1'


def _refused() -> ApiException:
    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps({"kind": "Status", "message": REFUSAL, "code": 403})
    return err


def test_the_typed_clients_refusal_gives_the_status_message() -> None:
    assert api_message(_refused()) == REFUSAL


def test_the_dynamic_clients_refusal_gives_it_too_not_a_method_repr() -> None:
    # The dynamic client (server-side apply of a backend's objects) wraps the error;
    # its ``summary`` is a method, which ApplyFailed events once printed.
    assert api_message(api_exception(_refused())) == REFUSAL


def test_without_a_status_body_the_reason_is_given() -> None:
    assert api_message(ApiException(status=500, reason="Internal Server Error")) == (
        "Internal Server Error"
    )
