"""The firmware hooks read a node's flash Job from the watch's cache, and ask the apiserver
only for one the cache does not show.

The Job calls go to a recording stand-in for ``BatchV1Api`` (set on the hooks), so a test
can count them; the real list, watch and reads are in tests/integration/test_tt_firmware.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kmodkit.backends import tenstorrent
from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.firmware_api import TenstorrentFirmwarePolicySpec
from kmodkit.backends.tenstorrent.firmware_hooks import FirmwareHooks, FirmwareTarget, needs_flash
from kmodkit.backends.tenstorrent.firmware_job import flash_job
from kmodkit.backends.tenstorrent.firmware_plan import FLASH_JOBS
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.sdk import Obj, Pending, RolloutKeys, Validated
from tests.unit.backends.cached import as_cached

SPEC = TenstorrentFirmwarePolicySpec.model_validate({"version": "19.9.0", "nodeSelector": {}})
OWNER = {"metadata": {"name": "fw", "uid": "policy-uid"}}
TARGET = FirmwareTarget("fw", SPEC.readback(), auto_upgrade=True, force_request=None)
KEYS = RolloutKeys.for_policy(names.firmware_policy_id("fw"))
NS = "kmodkit-system"
NODE: Obj = {"metadata": {"name": "n1", "annotations": {KEYS.attempt: "2", KEYS.target: "19.9.0"}}}


class Batch:
    """Stand-in for ``BatchV1Api``: records each call; reads answer ``stored``."""

    def __init__(self, stored: Obj | None = None, delete_status: int | None = None) -> None:
        self.stored, self.delete_status = stored, delete_status
        self.calls: list[str] = []

    def read_namespaced_job(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls.append("read")
        if self.stored is None:
            raise ApiException(status=404)
        return SimpleNamespace(data=json.dumps(self.stored).encode())

    def create_namespaced_job(self, namespace: str, body: Any) -> None:
        self.calls.append("create")

    def delete_namespaced_job(self, name: str, namespace: str, **_: Any) -> None:
        self.calls.append("delete")
        if self.delete_status is not None:
            raise ApiException(status=self.delete_status)


def _job(attempt: str, *conditions: str) -> Obj:
    """A flash Job, its status as the Job controller writes it."""
    job = flash_job(OWNER, "n1", attempt, NS, SPEC, TenstorrentSettings.from_settings({}))
    job["status"] = {"conditions": [{"type": c, "status": "True"} for c in conditions]}
    if "Complete" in conditions:
        job["status"]["succeeded"] = 1
    return job


def _hooks(batch: Batch, *cached: Obj, target: FirmwareTarget = TARGET) -> FirmwareHooks:
    jobs = {
        str(j["metadata"]["name"]): j
        for j in as_cached(tenstorrent.backend, {FLASH_JOBS: cached})[FLASH_JOBS]
    }
    settings = TenstorrentSettings.from_settings({})
    hooks = FirmwareHooks(None, OWNER, SPEC, settings, NS, target, jobs)
    hooks._batch = batch  # type: ignore[assignment]
    hooks._core = None  # type: ignore[assignment]  # a write to the node would fail
    return hooks


FLASHED = Validated(
    labels={keys.TT_FW_VERSION_LABEL: SPEC.readback()},
    annotations={
        keys.TT_FW_CURRENT_VERSION_ANNOTATION: SPEC.readback(),
        keys.TT_FW_LAST_JOB_ANNOTATION: str(_job("2@19.9.0")["metadata"]["name"]),
    },
)
"""A flashed node's record, for the rollout to write with its move on (never by the hook)."""


def test_a_job_the_watch_shows_costs_no_read() -> None:
    batch = Batch()
    assert isinstance(_hooks(batch, _job("2@19.9.0")).validate(NODE), Pending)
    assert batch.calls == []


def test_a_succeeded_job_is_not_watched_and_is_read_once_to_move_its_node_on() -> None:
    """A succeeded flash Job stays a day, on every node flashed: the watch leaves it out,
    and the one pass that needs it reads it."""
    succeeded = _job("2@19.9.0", "Complete")
    batch = Batch(stored=succeeded)
    hooks = _hooks(batch, succeeded)
    assert hooks._jobs == {}
    assert hooks.validate(NODE) == FLASHED
    assert batch.calls == ["read"]


def test_a_forced_flash_is_recorded_so_that_it_is_not_forced_again() -> None:
    forced = FirmwareTarget("fw", SPEC.readback(), auto_upgrade=True, force_request=5)
    succeeded = _job("2@19.9.0", "Complete")
    verdict = _hooks(Batch(stored=succeeded), target=forced).validate(NODE)
    assert isinstance(verdict, Validated)
    assert verdict.annotations[keys.TT_FW_FORCED_ANNOTATION] == "fw/5"
    assert needs_flash(verdict.annotations, forced) is False


def test_a_job_the_watch_does_not_show_is_read_from_the_apiserver() -> None:
    batch = Batch(stored=_job("2@19.9.0", "Complete"))
    assert _hooks(batch).validate(NODE) == FLASHED
    assert batch.calls == ["read"]
    batch = Batch()
    assert isinstance(_hooks(batch).validate(NODE), Pending)
    assert batch.calls == ["read", "create"]


@pytest.mark.parametrize("delete_status", [None, 404])
def test_an_earlier_attempts_job_is_replaced_even_when_already_gone(
    delete_status: int | None,
) -> None:
    """The cache can still show a Job the apiserver has removed: its deletion answers 404,
    which is what was asked for."""
    batch = Batch(delete_status=delete_status)
    verdict = _hooks(batch, _job("1@19.9.0", "Failed")).validate(NODE)
    assert isinstance(verdict, Pending), verdict  # not the earlier attempt's failure
    assert batch.calls == ["delete"]
