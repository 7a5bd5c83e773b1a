"""Safety rules of the Tenstorrent rollouts: optional cordon and drain, what the full drain
spares, and deletion under a flash."""

from __future__ import annotations

from typing import Any

from kmodkit.backends.tenstorrent.drain_rules import driver_policy, firmware_policy
from kmodkit.backends.tenstorrent.driver_api import DriverUpgradePolicy
from kmodkit.backends.tenstorrent.firmware_api import FirmwareUpgradePolicy
from kmodkit.backends.tenstorrent.firmware_deletion import running_flashes
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings

POLICY = {"metadata": {"name": "fw", "uid": "u1"}}


def _job(name: str, node: str, uid: str | None = "u1", **condition: str) -> dict[str, Any]:
    annotations = {} if uid is None else {"firmware.tenstorrent.com/cr-uid": uid}
    status = {"conditions": [{**condition, "status": "True"}]} if condition else {}
    return {
        "metadata": {
            "name": name,
            "labels": {"firmware.tenstorrent.com/node": node},
            "annotations": annotations,
        },
        "status": status,
    }


def test_without_drain_the_firmware_rollout_neither_cordons_nor_evicts() -> None:
    upgrade = FirmwareUpgradePolicy.model_validate({"drain": {"enable": False}})
    policy = firmware_policy(upgrade, TenstorrentSettings())
    assert policy.cordon is False
    assert policy.device_eviction.enable is False
    assert policy.deploy_gates == {}


def test_with_drain_the_firmware_rollout_cordons_gates_and_evicts() -> None:
    policy = firmware_policy(FirmwareUpgradePolicy(), TenstorrentSettings())
    assert policy.cordon is True and policy.device_eviction.enable is True
    assert policy.deploy_gates == {"tenstorrent.com/deploy.tt-telemetry": "false"}


def test_only_this_policys_unfinished_flashes_hold_its_deletion() -> None:
    jobs = [
        _job("running", "n1"),
        _job("legacy", "n2", uid=None),
        _job("done", "n3", type="Complete"),
        _job("failed", "n4", type="Failed"),
        _job("earlier-policy", "n5", uid="u0"),
    ]
    assert running_flashes(POLICY, jobs) == ["n1 (Job running)", "n2 (Job legacy)"]


def test_no_running_flash_lets_the_deletion_go() -> None:
    assert running_flashes(POLICY, [_job("done", "n1", type="SuccessCriteriaMet")]) == []


def test_the_drivers_full_drain_spares_the_operator_namespace() -> None:
    policy = driver_policy(DriverUpgradePolicy(), TenstorrentSettings(), "kmodkit-system")
    assert policy.drain.enable is True
    assert policy.drain.spared_namespaces == ["kmodkit-system"]
