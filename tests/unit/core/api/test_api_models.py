"""The Module model reads and writes KMM's field names and shapes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kmodkit.core.api import API_VERSION, Module, RegistryTLS
from tests.unit.examples import kmm_example, kmodkit_example, minimal


def _as_given(module: Module) -> dict[str, Any]:
    return module.model_dump(by_alias=True, exclude_unset=True, mode="json")


def test_kmm_body_round_trips_unchanged() -> None:
    body = kmm_example()
    module = Module.model_validate(body)
    assert _as_given(module) == body
    assert Module.model_validate(module.to_wire()) == module


def test_kmodkit_body_differs_from_kmm_only_in_api_version_and_rollout() -> None:
    kmodkit = _as_given(Module.model_validate(kmodkit_example()))
    kmm = kmm_example()
    kmodkit["apiVersion"] = kmm["apiVersion"]
    del kmodkit["spec"]["rollout"]
    assert kmodkit == kmm


def test_acronym_fields_keep_kmm_spelling() -> None:
    tls = RegistryTLS(insecure_skip_tls_verify=True)
    assert tls.to_wire() == {"insecure": False, "insecureSkipTLSVerify": True}
    container = Module.model_validate(kmm_example()).spec.module_loader.container
    assert container.registry_tls == RegistryTLS(insecure_skip_tls_verify=True)
    assert container.build is not None
    assert container.build.base_image_registry_tls == RegistryTLS(insecure=True)


def test_defaults_match_kmm_and_kmodkit() -> None:
    module = Module.model_validate(minimal())
    assert module.api_version == API_VERSION
    assert module.spec.module_loader.container.modprobe.dir_name == "/opt"
    policy = module.spec.rollout_policy()
    assert policy.max_unavailable == 1
    assert "rollout" not in module.to_wire()["spec"]


def test_unknown_fields_are_refused_not_dropped() -> None:
    body = minimal()
    body["spec"]["moduleLoader"]["container"]["kernelMapings"] = []
    with pytest.raises(ValidationError) as err:
        Module.model_validate(body)
    assert err.value.errors()[0]["loc"] == ("spec", "moduleLoader", "container", "kernelMapings")


def test_metadata_keeps_fields_kmodkit_does_not_model() -> None:
    body = minimal()
    body["metadata"]["uid"] = "1234"
    assert Module.model_validate(body).to_wire()["metadata"]["uid"] == "1234"
