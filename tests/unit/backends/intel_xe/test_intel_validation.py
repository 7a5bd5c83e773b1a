"""ClusterPolicy validation: every rule's message, offline and as CEL in the generated CRD."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kmodkit.backends.intel_xe import api
from kmodkit.backends.intel_xe.crd import CRD, admission_documents
from kmodkit.backends.intel_xe.rules import cluster_policy_problems
from kmodkit.core.schema.crd import crd_manifest
from tests.unit.backends.intel_xe.cluster_policy_cases import (
    MAPPING_CASES,
    SPEC_CASES,
    Case,
    kernel_module,
)

SAMPLE = Path(__file__).resolve().parents[4] / "docs" / "samples" / "clusterpolicy-ubuntu26.04.yaml"


def policy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "gpu-policy"},
        "spec": {"resourceRegistration": "dp", **spec},
    }


def problems(obj: dict[str, Any], namespace: str = "kmodkit-system") -> dict[str, str]:
    return {p.path: p.message for p in cluster_policy_problems(obj, namespace)}


def test_a_complete_policy_and_the_sample_are_valid() -> None:
    assert problems(policy(kernelModule=kernel_module())) == {}
    sample = yaml.safe_load(SAMPLE.read_text())
    assert problems(sample) == {}


def test_defaults() -> None:
    parsed = api.ClusterPolicy.model_validate(policy(kernelModule=kernel_module()))
    km = parsed.spec.kernel_module
    assert km is not None and km.module_name == "xe" and km.engine == "Auto"
    assert parsed.spec.resource_monitoring is False and parsed.spec.use_nfd_labeling is False
    health = api.HealthSpec()
    assert (health.check_interval_seconds, health.core_temperature_threshold) == (5, 100)
    assert api.DraSpec().pod_health_check is True
    assert api.XpuSpec().monitoring_resource == "monitoring"


@pytest.mark.parametrize("case", [*SPEC_CASES, *MAPPING_CASES], ids=lambda c: c.id)
def test_each_rule_names_its_field(case: Case) -> None:
    found = problems(policy(**case.spec))
    assert case.path in found, found
    assert case.offline in found[case.path]


@pytest.mark.parametrize(
    ("field", "image"),
    [("dp", "plugin"), ("dp", "levelzero"), ("dra", "image"), ("xpu", "image")],
)
def test_operand_images_with_a_tag_pass(field: str, image: str) -> None:
    assert problems(policy(**{field: {image: "registry:5000/intel/plugin:1.0"}})) == {}


def test_templated_images_with_a_tag_after_the_variables_pass() -> None:
    for image in (
        "reg.local/${MOD_NAMESPACE}/$MOD_NAME:v1.0",
        "reg.local/xe:v7.1.4.6-$KERNEL_FULL_VERSION",
        "reg.local:5000/xe@sha256:" + "a" * 64,
    ):
        km = kernel_module()
        km["kernelMappings"][0]["containerImage"] = image
        assert problems(policy(kernelModule=km)) == {}, image


def test_schema_errors_are_reported_by_field() -> None:
    obj = policy(kernelModule={"kernelMappings": [{"regexp": "x"}]}, resourceRegistration="gpu")
    found = problems(obj)
    assert "spec.resourceRegistration" in found
    assert found["spec.kernelModule.kernelMappings[0].containerImage"] == "is required"
    assert problems(policy(kernelModule={"kernelMappings": []}))[
        "spec.kernelModule.kernelMappings"
    ].startswith("list should have at least 1 item")


def test_name_and_operator_namespace_must_fit_kmm_label_keys() -> None:
    obj = policy()
    obj["metadata"]["name"] = "a" * 24  # 24 + len("-gpu") + len("kmodkit-system") = 42
    found = problems(obj)
    assert found["metadata.name"].startswith(api.POLICY_NAME_LENGTH_MSG)
    assert "totals 42" in found["metadata.name"]
    assert problems(obj, namespace="gpu") == {}
    obj["metadata"]["name"] = "Gpu_Policy"
    assert problems(obj)["metadata.name"] == api.OBJECT_NAME_MSG


def test_cli_validates_cluster_policies(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kmodkit.core.cli.main import main

    bad = copy.deepcopy(policy(kernelModule=kernel_module(modulesLoadingOrder=["xe"])))
    path = tmp_path / "cp.yaml"
    path.write_text(yaml.safe_dump_all([yaml.safe_load(SAMPLE.read_text()), bad]))
    result = CliRunner().invoke(main, ["validate", "-f", str(path)])
    assert result.exit_code == 2
    assert f"spec.kernelModule.modulesLoadingOrder: {api.ORDER_SIZE_MSG}" in result.output


def _rules(schema: dict[str, Any]) -> list[dict[str, str]]:
    found = list(schema.get("x-kubernetes-validations", []))
    for child in schema.get("properties", {}).values():
        found += _rules(child)
    if "items" in schema:
        found += _rules(schema["items"])
    return found


def test_crd_carries_every_rule_as_cel_naming_its_field() -> None:
    crd = crd_manifest(CRD)
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["scope"] == "Cluster"
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "DP",
        "DRA",
        "XPU",
        "KMM",
        "Age",
    ]
    messages = {r["message"] for r in _rules(version["schema"]["openAPIV3Schema"])}
    for subject, message in [
        ("metadata.name", api.POLICY_NAME_LENGTH_MSG),
        ("dp.allowIDs", api.PCI_ID_MSG),
        ("dp.denyIDs", api.PCI_ID_MSG),
        ("dp.plugin", api.IMAGE_MSG),
        ("dra.image", api.IMAGE_MSG),
        ("xpu.image", api.IMAGE_MSG),
        ("pullSecret.name", api.OBJECT_NAME_MSG),
        ("xpu.configMapOverride", api.OBJECT_NAME_MSG),
        ("kernelModule.modulesLoadingOrder", api.ORDER_SIZE_MSG),
        ("kernelModule.modulesLoadingOrder[0]", api.ORDER_FIRST_MSG),
        ("kernelModule.modulesLoadingOrder", api.ORDER_DUPLICATE_MSG),
        ("kernelModule.version", api.VERSION_MSG),
        ("kernelModule.firmwarePath", api.FIRMWARE_PATH_MSG),
        ("regexp", api.REGEXP_REQUIRED_MSG),
        ("containerImage", api.MAPPING_IMAGE_REQUIRED_MSG),
        ("containerImage", api.MAPPING_IMAGE_TAG_MSG),
        ("build.dockerfileConfigMap.name", api.DOCKERFILE_CONFIGMAP_MSG),
    ]:
        assert f"{subject}: {message}" in messages, subject
    assert api.IDS_BOTH_MSG in messages


def test_admission_policy_checks_the_labelled_operator_namespace() -> None:
    policy_doc, binding = admission_documents()
    assert policy_doc["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "Namespace"}
    (validation,) = policy_doc["spec"]["validations"]
    assert "params.metadata.name" in validation["expression"]
    assert binding["spec"]["paramRef"]["selector"] == {
        "matchLabels": {"kmodkit.io/operator-namespace": "true"}
    }
