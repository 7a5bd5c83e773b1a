"""The loader pods' copies of module images on the host: held while used, removed after.

Each copy is ``/var/lib/kmodkit/staging/<namespace>.<module>/<pod UID>/`` under a
temp host root. Another agent is played by holding a copy's claim through a
second open file (flock locks belong to the open file, so this conflicts as a
second process would).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from kmodkit.agent.cli import main
from kmodkit.agent.errors import ExitCode
from kmodkit.agent.hostroot import HostRoot
from kmodkit.agent.jsonlog import EventLog
from kmodkit.agent.staging import (
    STAGING_ENV,
    STAGING_ROOT,
    StagingError,
    claimed,
    prune,
    release_module,
)
from tests.node.harness import DEVICE, Node

DAY = 24 * 3600.0


def _copy(host: HostRoot, module: str, uid: str, *, claim: bool, age: float = 0.0) -> Path:
    """A copy as an init container leaves it (and, with ``claim``, as an agent that ran
    and stopped leaves it), last touched ``age`` seconds ago."""
    copy = host.path(f"{STAGING_ROOT}/{module}/{uid}")
    (copy / "modules").mkdir(parents=True)
    (copy / "modules" / "xe.ko").write_text("module")
    touched = copy / "claim" if claim else copy
    if claim:
        touched.touch()
    then = time.time() - age
    os.utime(touched, (then, then))
    return copy


@contextmanager
def held(copy: Path) -> Iterator[None]:
    """Another agent holding ``copy``'s claim."""
    fd = os.open(copy / "claim", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def test_prune_removes_only_copies_nobody_holds_and_nobody_touched_for_a_day(
    tmp_path: Path,
) -> None:
    host = HostRoot(tmp_path)
    own = _copy(host, "drivers.xe", "own", claim=True)
    stopped_long_ago = _copy(host, "drivers.xe", "old", claim=True, age=2 * DAY)
    restarting = _copy(host, "drivers.xe", "restarting", claim=True, age=3600)
    never_started = _copy(host, "gpu.other", "never", claim=False, age=2 * DAY)
    copying_now = _copy(host, "gpu.other", "copying", claim=False)
    serving = _copy(host, "gpu.third", "serving", claim=True, age=2 * DAY)

    with held(serving):
        removed = prune(host.path(STAGING_ROOT), keep=own, now=time.time())

    assert sorted(removed) == sorted([stopped_long_ago, never_started])
    for kept in (own, restarting, copying_now, serving):
        assert (kept / "modules" / "xe.ko").exists(), kept
    assert not stopped_long_ago.exists() and not never_started.exists()


def test_prune_removes_a_module_directory_it_emptied(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    own = _copy(host, "drivers.xe", "own", claim=True)
    gone = _copy(host, "gpu.gone", "old", claim=True, age=2 * DAY)
    prune(host.path(STAGING_ROOT), keep=own, now=time.time())
    assert not gone.parent.exists()


def test_a_claimed_copy_is_never_pruned_however_old(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    staging = f"{STAGING_ROOT}/drivers.xe/live"
    with claimed(host, staging, EventLog("test")) as own:
        assert own is not None
        os.utime(own / "claim", (0, 0))  # as if touched decades ago
        other = _copy(host, "drivers.xe", "next", claim=True)
        assert prune(host.path(STAGING_ROOT), keep=other, now=time.time()) == []
        assert own.exists()


def test_a_starting_agent_prunes_and_touches_its_own_copy(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    old = _copy(host, "drivers.xe", "old", claim=True, age=2 * DAY)
    own = _copy(host, "drivers.xe", "own", claim=True, age=2 * DAY)
    with claimed(host, f"{STAGING_ROOT}/drivers.xe/own", EventLog("test")):
        assert not old.exists()
        assert time.time() - (own / "claim").stat().st_mtime < 60


def test_a_copy_outside_the_staging_directory_is_refused(tmp_path: Path) -> None:
    with (
        pytest.raises(StagingError, match=STAGING_ENV),
        claimed(HostRoot(tmp_path), "/etc/drivers.xe/uid", EventLog("test")),
    ):
        pass


def test_an_agent_whose_copy_was_pruned_while_it_waited_says_so(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    copy = _copy(host, "drivers.xe", "late", claim=True, age=2 * DAY)
    failures: list[BaseException] = []

    def start() -> None:
        try:
            with claimed(host, f"{STAGING_ROOT}/drivers.xe/late", EventLog("test")):
                pass
        except StagingError as exc:
            failures.append(exc)

    with held(copy):  # a pruner found it idle for a day and removes it
        starting = threading.Thread(target=start)
        starting.start()
        time.sleep(0.1)
        (copy / "claim").unlink()
        (copy / "modules" / "xe.ko").unlink()
    starting.join(timeout=5)
    assert len(failures) == 1 and "delete the pod" in str(failures[0])


def test_release_module_removes_its_stopped_copies_but_not_a_pod_still_copying(
    tmp_path: Path,
) -> None:
    host = HostRoot(tmp_path)
    own = _copy(host, "drivers.xe", "unloader", claim=True)
    loader_gone = _copy(host, "drivers.xe", "loader", claim=True)
    copying = _copy(host, "drivers.xe", "copying", claim=False)
    still_held = _copy(host, "drivers.xe", "held", claim=True)
    other_module = _copy(host, "gpu.other", "loader", claim=True)
    with held(still_held):
        removed = release_module(own)
    assert sorted(removed) == sorted([loader_gone, own])
    for kept in (copying, still_held, other_module):
        assert kept.exists(), kept


def _unload(node: Node, staging: str) -> tuple[int, str]:
    config_file = node.config_file()
    result = CliRunner().invoke(
        main,
        ["--host-root", str(node.root), "--config", str(config_file), "unload"],
        obj=node.access(),
        env={STAGING_ENV: staging},
    )
    return result.exit_code, result.output


def test_an_unloader_removes_the_modules_copies_only_once_it_succeeded(node: Node) -> None:
    node.image_pair()
    node.agent().load()
    loader = _copy(node.host, "drivers.xe", "loader", claim=True)
    unloader = f"{STAGING_ROOT}/drivers.xe/unloader"
    node.kernel.open_device(4242, "train.py", DEVICE)
    code, _ = _unload(node, unloader)
    assert code == ExitCode.BUSY
    # The retry needs the copy (init containers do not run again): all stays.
    assert loader.exists() and node.host.path(unloader).exists()

    node.kernel.kill(4242, 9)  # the workload ends
    code, output = _unload(node, unloader)
    assert code == ExitCode.OK, output
    assert node.loaded() == []
    assert not node.host.path(f"{STAGING_ROOT}/drivers.xe").exists()
