"""The kmodkit-agent command: exit codes, JSON lines, status from the live kernel."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kmodkit.agent import cli
from kmodkit.agent.cli import main
from kmodkit.agent.errors import ExitCode
from kmodkit.agent.host_lock import LockTimeout, host_lock
from kmodkit.agent.lifecycle import serve
from tests.node.harness import DEP, DEVICE, TOP, Node


def agent_cli(node: Node, *args: str, **config: Any) -> Result:
    config_file = node.config_file(**config)
    return CliRunner().invoke(
        main,
        ["--host-root", str(node.root), "--config", str(config_file), *args],
        obj=node.access(),
    )


def lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.output.splitlines()]


def test_every_line_is_one_json_object_ending_with_the_exit_code(node: Node) -> None:
    node.image_pair()
    result = agent_cli(node, "load")

    assert result.exit_code == 0, result.output
    records = lines(result)
    assert all({"ts", "level", "command", "event"} <= r.keys() for r in records)
    assert {r["command"] for r in records} == {"load"}
    assert records[-1]["event"] == "exit"
    assert records[-1]["exit_code"] == 0
    assert [r["event"] for r in records if r["event"].startswith("module.")] == [
        "module.loaded",
        "module.loaded",
    ]


def test_load_failure_exits_1_with_the_reason(node: Node) -> None:
    result = agent_cli(node, "load")

    assert result.exit_code == ExitCode.FAILED
    error = next(r for r in lines(result) if r["level"] == "error")
    assert "no modules for kernel" in error["message"]


def test_busy_unload_exits_3_and_names_the_holder(node: Node) -> None:
    node.image_pair()
    assert agent_cli(node, "load").exit_code == 0
    node.kernel.open_device(4242, "tt-smi", DEVICE)

    result = agent_cli(node, "unload")

    assert result.exit_code == ExitCode.BUSY
    refused = next(r for r in lines(result) if r["event"] == "unload.refused")
    assert refused["holders"][0]["pid"] == 4242
    assert refused["holders"][0]["comm"] == "tt-smi"
    assert node.loaded() == [DEP, TOP]


def test_force_unload_flag_overrides_the_config(node: Node) -> None:
    node.image_pair()
    assert agent_cli(node, "load").exit_code == 0
    node.kernel.open_device(4242, "tt-smi", DEVICE)

    result = agent_cli(node, "unload", "--force-unload")

    assert result.exit_code == 0, result.output
    assert node.kernel.kills == [(4242, signal.SIGKILL)]
    assert node.loaded() == []


def test_host_managed_load_exits_4(node: Node) -> None:
    node.image_pair()
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")

    result = agent_cli(node, "load")

    assert result.exit_code == ExitCode.HOST_MANAGED
    assert node.loaded() == []


def test_detect_exit_codes(node: Node) -> None:
    root = ["--host-root", str(node.root)]
    container = CliRunner().invoke(main, [*root, "detect", "--dkms-module", TOP])
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")
    host = CliRunner().invoke(main, [*root, "detect", "--dkms-module", TOP])
    from_config = agent_cli(node, "detect")
    other_name = CliRunner().invoke(main, [*root, "detect", "--dkms-module", "xe"])

    assert container.exit_code == ExitCode.OK
    assert host.exit_code == from_config.exit_code == ExitCode.HOST_MANAGED
    assert other_name.exit_code == ExitCode.OK
    detected = next(r for r in lines(host) if r["event"] == "host_mode.detected")
    assert detected["install_mode"] == "host"
    assert detected["signals"] == [
        {"kind": "dkms-source", "path": "/usr/src/tenstorrent-2.8.0/dkms.conf"}
    ]


def test_status_reads_the_live_kernel_not_a_stamp(node: Node) -> None:
    node.image_pair()
    assert agent_cli(node, "status").exit_code == ExitCode.NOT_READY
    assert agent_cli(node, "load").exit_code == 0
    assert agent_cli(node, "status").exit_code == ExitCode.OK

    node.kernel(["rmmod", TOP])  # someone unloads it behind the agent's back

    result = agent_cli(node, "status")
    assert result.exit_code == ExitCode.NOT_READY
    status = next(r for r in lines(result) if r["event"] == "status")
    assert status["problems"] == ["tenstorrent is not loaded"]


def test_status_reports_a_version_mismatch(node: Node) -> None:
    node.preload_pair("2.8.0")
    result = agent_cli(node, "status")
    assert result.exit_code == ExitCode.NOT_READY
    status = next(r for r in lines(result) if r["event"] == "status")
    assert status["problems"] == ["tenstorrent version is 2.8.0, expected 2.9.0"]


def test_status_on_a_host_managed_node(node: Node) -> None:
    node.preload_pair("2.8.0")
    (node.root / "var/lib/dkms/tenstorrent").mkdir(parents=True)

    assert agent_cli(node, "status").exit_code == ExitCode.HOST_MANAGED
    assert agent_cli(node, "status", "--ready-if-host-managed").exit_code == ExitCode.OK


def test_config_problems_exit_2_naming_the_field(node: Node, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("modprobe:\n  moduleName: tenstorrent\n  modulesLoadingOrder: [tt_helper]\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("modprobe: [unclosed\n")
    root = ["--host-root", str(node.root)]

    invalid = CliRunner().invoke(main, [*root, "--config", str(bad), "load"])
    unparsable = CliRunner().invoke(main, [*root, "--config", str(broken), "load"])
    missing = CliRunner().invoke(main, [*root, "load"])

    assert invalid.exit_code == unparsable.exit_code == missing.exit_code == ExitCode.USAGE
    problem = next(r for r in lines(invalid) if r["event"] == "config.invalid")
    assert "modulesLoadingOrder needs at least 2 entries" in problem["message"]
    assert "needs --config" in lines(missing)[0]["message"]


def test_a_second_agent_waits_for_the_first_then_gives_up(node: Node) -> None:
    node.image_pair()
    with host_lock(node.host, TOP, timeout=1), pytest.raises(LockTimeout):
        node.agent().load()
    assert node.loaded() == []


def test_run_leaves_the_driver_loaded_on_terminate_by_default(node: Node) -> None:
    node.image_pair()
    stop = threading.Event()
    stop.set()  # SIGTERM arrives right after loading
    agent = node.agent()

    serve(agent, stop, unload_on_terminate=False)

    assert node.loaded() == [DEP, TOP]
    assert node.events("terminating.left_loaded")


def test_run_unloads_on_terminate_when_asked(node: Node) -> None:
    node.image_pair()
    stop = threading.Event()
    stop.set()

    serve(node.agent(), stop, unload_on_terminate=True)

    assert node.loaded() == []
    assert [c[1] for c in node.kmod_calls("rmmod")] == [TOP, DEP]


def test_run_idles_on_a_host_managed_node(node: Node) -> None:
    node.image_pair()
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")
    stop = threading.Event()
    stop.set()

    serve(node.agent(), stop, unload_on_terminate=True)

    assert node.kernel.calls[-1][0] == "depmod"  # from image_pair; nothing since
    assert node.events("host_managed.idle")


@pytest.mark.parametrize("host_managed", [False, True])
def test_the_real_process_stops_cleanly_on_sigterm(node: Node, host_managed: bool) -> None:
    # Already loaded at the right version, and built on the node (so no image
    # to read with modinfo): the real process needs no kmod tools.
    node.preload_pair("2.9.0")
    if host_managed:
        node.write_host("/usr/src/tenstorrent-2.9.0/dkms.conf")
    process = node.run_agent()
    assert process.stdout is not None
    output = []
    for line in process.stdout:
        output.append(json.loads(line))
        if output[-1]["event"] == "serving":
            break
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=20)
    output += [json.loads(line) for line in rest.splitlines()]

    assert process.returncode == 0
    events = [r["event"] for r in output]
    assert "terminating.left_loaded" in events
    assert events[-1] == "exit"
    assert node.loaded() == [DEP, TOP]


def test_a_serving_loader_loads_again_a_driver_that_vanished(node: Node) -> None:
    node.image_pair()
    stop = threading.Event()
    agent = node.agent()
    loader = threading.Thread(
        target=serve,
        args=(agent, stop),
        kwargs={"unload_on_terminate": False, "recheck_seconds": 0},
    )
    loader.start()
    try:
        _wait_for(lambda: bool(node.events("serving")))  # the first load is done
        node.kernel(["rmmod", TOP])  # an admin's rmmod, or a crashed module
        _wait_for(lambda: bool(node.events("module.disappeared")) and node.loaded() == [DEP, TOP])
    finally:
        stop.set()
        loader.join(timeout=10)
    assert not loader.is_alive()


def test_an_unload_waits_for_every_serving_loader_of_the_module(node: Node) -> None:
    node.image_pair()
    node.agent().load()
    with node.agent().serving(), pytest.raises(LockTimeout):
        node.agent().unload(force=False)
    assert node.loaded() == [DEP, TOP]

    node.agent().unload(force=False)
    assert node.loaded() == []


def test_a_failed_command_leaves_its_reason_for_the_kubelet(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.image_pair()
    node.agent().load()
    node.kernel.open_device(4242, "train.py", DEVICE)
    last_words = tmp_path / "termination-log"
    last_words.write_text("")
    monkeypatch.setattr(cli, "TERMINATION_LOG", last_words)

    result = CliRunner().invoke(
        main,
        ["--host-root", str(node.root), "--config", str(node.config_file()), "unload"],
        obj=node.access(),
    )

    assert result.exit_code == ExitCode.BUSY
    assert "pid 4242 (train.py)" in last_words.read_text()


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_unloader_leaves_a_dkms_managed_driver_alone_and_succeeds(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")

    plain = agent_cli(node, "unload")
    unloader = agent_cli(node, "unload", "--host-managed-ok")

    assert plain.exit_code == ExitCode.HOST_MANAGED
    assert unloader.exit_code == ExitCode.OK
    assert node.loaded() == [DEP, TOP]


def test_a_predecessor_never_takes_a_successors_swap_for_a_vanished_driver(node: Node) -> None:
    # The old loader (its image carries build OLD) is still running when the new one
    # swaps the module: between the old build's unload and the new one's load, the
    # driver is absent, but the successor holds the lock throughout.
    node.image_module(DEP, version="2.9.0", srcversion="OLDDEP")
    node.image_module(TOP, version="2.9.0", srcversion="OLD", depends=[DEP], devices=[DEVICE])
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    predecessor = node.agent()
    outcome: list[bool] = []
    with host_lock(node.host, TOP, timeout=1):
        checker = threading.Thread(target=lambda: outcome.append(predecessor.reload_if_gone()))
        checker.start()
        time.sleep(0.05)  # it saw the driver absent and now waits for the lock
        node.preload(DEP, version="2.9.0", srcversion="NEWDEP")
        node.preload(TOP, version="2.9.0", srcversion="NEW", depends=[DEP], devices=[DEVICE])
    checker.join(timeout=5)

    assert outcome == [False]
    assert node.kernel.modules[TOP].srcversion == "NEW"
    assert not node.events("module.disappeared")
