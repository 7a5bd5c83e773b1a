"""The objects Tenstorrent policies own: the builder DaemonSet and the flash Job."""

from __future__ import annotations

import random

from kmodkit.backends.tenstorrent import names
from kmodkit.backends.tenstorrent.driver_api import TenstorrentDriverPolicySpec
from kmodkit.backends.tenstorrent.driver_daemonset import daemonset, template_hash
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.firmware_job import flash_job
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings


def _spec(**extra: object) -> TenstorrentDriverPolicySpec:
    return TenstorrentDriverPolicySpec.model_validate(
        {
            "version": "2.8.0",
            "nodeAffinity": {"matchLabels": {"a": "1", "b": "2", "c": "3"}},
            **extra,
        }
    )


def _hash(ds: dict) -> str:  # type: ignore[type-arg]
    return str(ds["metadata"]["annotations"]["driver.tenstorrent.com/template-hash"])


def test_template_hash_is_stable_whatever_the_order_of_labels_and_settings() -> None:
    labels = [("a", "1"), ("b", "2"), ("c", "3")]
    env = {
        "KMODKIT_EXTRA_ENV_HTTPS_PROXY": "http://p:3128",
        "KMODKIT_EXTRA_ENV_NO_PROXY": "10.0.0.0/8",
    }
    hashes = set()
    for seed in range(10):
        random.Random(seed).shuffle(labels)
        items = list(env.items())
        random.Random(seed).shuffle(items)
        spec = TenstorrentDriverPolicySpec.model_validate(
            {"version": "2.8.0", "nodeAffinity": {"matchLabels": dict(labels)}}
        )
        hashes.add(
            _hash(daemonset("p", "ns", spec, TenstorrentSettings.from_settings(dict(items))))
        )
    assert len(hashes) == 1


def test_template_hash_follows_what_a_node_runs_but_not_force_unload() -> None:
    settings = TenstorrentSettings()
    base = _hash(daemonset("p", "ns", _spec(), settings))
    assert _hash(daemonset("p", "ns", _spec(version="2.9.0"), settings)) != base
    assert _hash(daemonset("p", "ns", _spec(installer={"image": "r/b:2"}), settings)) != base
    forced = daemonset("p", "ns", _spec(upgradePolicy={"forceUnload": True}), settings)
    assert _hash(forced) == base
    env = {
        e["name"]: e.get("value")
        for e in forced["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TT_FORCE_UNLOAD"] == "true"
    assert template_hash(forced["spec"]["template"] | {"metadata": {}}) != ""


def test_the_kmd_repository_reaches_the_builders_without_rolling_the_fleet() -> None:
    mirror = TenstorrentSettings.from_settings(
        {"KMODKIT_TT_KMD_REPOSITORY": " git://mirror.internal/tt-kmd.git "}
    )
    ds = daemonset("p", "ns", _spec(), mirror)
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TT_KMD_REPO"] == "git://mirror.internal/tt-kmd.git"
    assert _hash(ds) == _hash(daemonset("p", "ns", _spec(), TenstorrentSettings()))
    unset = daemonset("p", "ns", _spec(), TenstorrentSettings())["spec"]["template"]["spec"]
    assert "TT_KMD_REPO" not in {e["name"] for e in unset["containers"][0]["env"]}


def test_builder_daemonset_shape() -> None:
    settings = TenstorrentSettings.from_settings({"KMODKIT_EXTRA_ENV_HTTPS_PROXY": "http://p:3128"})
    ds = daemonset("p", "ns", _spec(), settings)
    assert ds["metadata"]["name"] == "ttdrv-p"
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"] == {"privileged": True}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TT_KMD_VERSION"] == "2.8.0" and env["HTTPS_PROXY"] == "http://p:3128"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "a", "operator": "In", "values": ["1"]},
        {"key": "b", "operator": "In", "values": ["2"]},
        {"key": "c", "operator": "In", "values": ["3"]},
        {
            "key": "feature.node.kubernetes.io/pci-1200_1e52.present",
            "operator": "In",
            "values": ["true"],
        },
        {"key": "driver.tenstorrent.com/skip", "operator": "NotIn", "values": ["true"]},
    ]


def test_without_the_pci_requirement_builders_go_to_nodes_without_the_pci_label() -> None:
    settings = TenstorrentSettings.from_settings({"KMODKIT_TT_REQUIRE_PCI_LABEL": "false"})
    pod = daemonset("p", "ns", _spec(), settings)["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = [e["key"] for e in term["matchExpressions"]]
    assert keys == ["a", "b", "c", "driver.tenstorrent.com/skip"]


def test_flash_job_names_are_deterministic_short_and_distinct() -> None:
    name = names.flash_job_name("default", "node-1", "19.9.0")
    assert name == names.flash_job_name("default", "node-1", "19.9.0")
    assert name.startswith("ttfwp-default-node-1-19-9-0-")
    assert name != names.flash_job_name("default", "node-1", "19.10.0")
    assert name != names.flash_job_name("default", "node-2", "19.9.0")
    long = names.flash_job_name("p" * 200, "n" * 200, "19.9.0")
    assert len(long) <= 63
    assert long != names.flash_job_name("p" * 200, "n" * 199 + "m", "19.9.0")


def test_flash_job_runs_pinned_with_the_timeout_and_flasher_options() -> None:
    spec = TenstorrentFirmwarePolicySpec.model_validate(
        {
            "version": "19.9.0",
            "nodeSelector": {},
            "upgradePolicy": {"flashTimeoutSeconds": 120},
            "flasher": {"forceWrite": True, "podLabels": {"team": "ml"}},
        }
    )
    owner = {
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": {"name": "fw", "uid": "u1"},
    }
    job = flash_job(owner, "node-1", "1@19.9.0", "ops", spec, TenstorrentSettings())
    assert job["spec"]["activeDeadlineSeconds"] == 120
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]
    assert pod["spec"]["nodeName"] == "node-1"
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["firmware.tenstorrent.com/version"] == "19-9-0"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["TT_FORCE_WRITE"] == "true" and env["TT_FW_READBACK"] == "19.9.0.0"
    assert pod["spec"]["serviceAccountName"] == "kmodkit-tenstorrent-flasher"
    assert pod["spec"]["automountServiceAccountToken"] is False
    # Owned by no one the garbage collector follows: deleting the policy never cuts a flash.
    assert "ownerReferences" not in job["metadata"]
    assert job["metadata"]["annotations"]["firmware.tenstorrent.com/cr-uid"] == "u1"
