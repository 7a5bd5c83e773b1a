"""Tenstorrent policies: defaults, validation messages and the CRDs' shape."""

from __future__ import annotations

from typing import Any

import pytest

from kmodkit.backends.tenstorrent import backend
from kmodkit.backends.tenstorrent.driver_api import TenstorrentDriverPolicySpec
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.core.cli.support import build_registry
from kmodkit.core.schema.crd import crd_manifest

SEED_TTDP = {
    "apiVersion": "driver.tenstorrent.com/v1alpha1",
    "kind": "TenstorrentDriverPolicy",
    "metadata": {"name": "migration-test"},
    "spec": {
        "version": "2.8.0",
        "nodeAffinity": {"matchLabels": {"kubernetes.io/hostname": "node-1"}},
        "paused": True,
        "upgradePolicy": {"drain": {"enable": True}},
    },
}


def _problems(obj: dict[str, Any]) -> dict[str, str]:
    return {p.path: p.message for p in build_registry().validate(obj)}


def _ttfwp(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": {"name": "fw"},
        "spec": {"version": "19.9.0", "nodeAffinity": {}, **spec},
    }


def test_the_guides_sample_is_valid_and_gets_upstreams_defaults() -> None:
    assert _problems(SEED_TTDP) == {}
    spec = TenstorrentDriverPolicySpec.model_validate(SEED_TTDP["spec"])
    drain = spec.upgrade_policy.drain
    assert (drain.enable, drain.full_node, drain.pod_selector_label) == (True, True, "")
    assert (drain.force, drain.delete_empty_dir, drain.timeout_seconds) == (False, True, 600)
    assert spec.upgrade_policy.force_unload is False
    assert spec.installer.image_pull_policy == "IfNotPresent"


def test_firmware_defaults_and_derived_values() -> None:
    spec = TenstorrentFirmwarePolicySpec.model_validate(_ttfwp()["spec"])
    policy = spec.upgrade_policy
    assert (policy.max_parallel, policy.flash_timeout_seconds) == (1, 900)
    assert policy.auto_upgrade and policy.halt_on_failure and policy.drain.enable
    assert spec.readback() == "19.9.0.0"
    assert spec.bundle().endswith("/v19.9.0/fw_pack-19.9.0.fwbundle")
    assert spec.flasher.homogenize_firmware_versions is False


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        ({"version": "2.8"}, "spec.version", "must be a release number MAJOR.MINOR.PATCH"),
        ({"nodeSelector": {}}, "spec", "exactly one of spec.nodeAffinity or spec.nodeSelector"),
        (
            {"upgradePolicy": {"drain": {"podSelectorLabel": "a in b"}}},
            "spec.upgradePolicy.drain.podSelectorLabel",
            "is not a label requirement",
        ),
        (
            {"installer": {"imagePullPolicy": "Sometimes"}},
            "spec.installer.imagePullPolicy",
            "must be Always, IfNotPresent or Never",
        ),
    ],
)
def test_driver_problems_name_the_field(spec: dict[str, Any], path: str, message: str) -> None:
    obj = {**SEED_TTDP, "spec": {**SEED_TTDP["spec"], **spec}}
    problems = _problems(obj)
    assert message in problems[path]


def test_no_selector_at_all_is_refused_too() -> None:
    spec = {k: v for k, v in SEED_TTDP["spec"].items() if k != "nodeAffinity"}
    assert "exactly one of" in _problems({**SEED_TTDP, "spec": spec})["spec"]


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        ({"upgradePolicy": {"maxParallel": 0}}, "spec.upgradePolicy.maxParallel", "1"),
        (
            {"upgradePolicy": {"flashTimeoutSeconds": 59}},
            "spec.upgradePolicy.flashTimeoutSeconds",
            "60",
        ),
        ({"readbackVersion": "19"}, "spec.readbackVersion", "tt-smi reports"),
        ({"bundleURL": "ftp://x"}, "spec.bundleURL", "http(s) URL"),
    ],
)
def test_firmware_problems_name_the_field(spec: dict[str, Any], path: str, message: str) -> None:
    assert message in _problems(_ttfwp(**spec))[path]


def _crd(kind: str) -> dict[str, Any]:
    resource = next(r for r in backend.resources if r.crd.kind == kind)
    return crd_manifest(resource.crd)


@pytest.mark.parametrize(
    ("kind", "short", "columns"),
    [
        (
            "TenstorrentDriverPolicy",
            "ttdp",
            ["Version", "Matched", "Ready", "UpToDate", "InProgress", "Failed", "Age"],
        ),
        (
            "TenstorrentFirmwarePolicy",
            "ttfwp",
            ["Version", "Matched", "UpToDate", "InProgress", "Failed", "Age"],
        ),
    ],
)
def test_crds_are_cluster_scoped_with_short_names_and_columns(
    kind: str, short: str, columns: list[str]
) -> None:
    crd = _crd(kind)
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == [short]
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["x-kubernetes-validations"][0]["message"] == (
        "exactly one of spec.nodeAffinity or spec.nodeSelector must be set"
    )
    assert spec["required"] == ["version"]
