"""Firmware goes onto the host before the module that requests it loads."""

from __future__ import annotations

from typing import Any

import pytest

from kmodkit.agent.errors import AgentError
from kmodkit.agent.firmware import kernel_searches
from tests.node.harness import DEP, TOP, Node


def _with_firmware(node: Node, firmware_path: str | None = None, **overrides: Any) -> Any:
    node.image_pair(firmware=["tenstorrent/fw.bin"])
    (node.image_firmware / "tenstorrent").mkdir(parents=True, exist_ok=True)
    (node.image_firmware / "tenstorrent/fw.bin").write_bytes(b"\x7fFW-2.9.0")
    return {
        "modprobe": {
            "moduleName": TOP,
            "dirName": str(node.image),
            "modulesLoadingOrder": [TOP, DEP],
            "firmwarePath": firmware_path or str(node.image_firmware),
        },
        **overrides,
    }


def test_the_simulated_driver_needs_its_firmware(node: Node) -> None:
    _with_firmware(node)
    with pytest.raises(AgentError, match="No such file or directory"):
        node.agent().load()


def test_firmware_is_placed_before_the_module_loads(node: Node) -> None:
    config = node.config(**_with_firmware(node))
    node.agent(config).load()

    assert node.loaded() == [DEP, TOP]
    placed = node.root / "var/lib/firmware/tenstorrent/fw.bin"
    assert placed.read_bytes() == b"\x7fFW-2.9.0"
    events = [e["event"] for e in node.events()]
    assert events.index("firmware.placed") < events.index("module.loaded")
    assert node.events("firmware.placed")[0]["installed"] == [
        "/var/lib/firmware/tenstorrent/fw.bin"
    ]


def test_a_host_dir_outside_the_kernel_search_list_becomes_the_class_path(node: Node) -> None:
    node.agent(node.config(**_with_firmware(node))).load()

    assert node.kernel.firmware_class_path() == "/var/lib/firmware"
    assert node.events("firmware.class_path_set")[0]["previous"] == ""


def test_a_searched_host_dir_leaves_the_class_path_alone(node: Node) -> None:
    config = node.config(**_with_firmware(node, firmwareHostPath="/lib/firmware"))
    node.agent(config).load()

    assert (node.root / "lib/firmware/tenstorrent/fw.bin").is_file()
    assert node.kernel.firmware_class_path() == ""
    assert node.events("firmware.class_path_set") == []


def test_replacing_another_custom_class_path_is_warned_about(node: Node) -> None:
    node.write_host("/sys/module/firmware_class/parameters/path", "/opt/other/firmware\n")
    node.agent(node.config(**_with_firmware(node))).load()

    warning = node.events("firmware.class_path_replaced")[0]
    assert warning["level"] == "warning"
    assert warning["previous"] == "/opt/other/firmware"


def test_a_kernel_without_the_class_path_parameter_is_warned_about(node: Node) -> None:
    (node.root / "sys/module/firmware_class/parameters/path").unlink()
    config = node.config(**_with_firmware(node))
    with pytest.raises(AgentError):
        node.agent(config).load()

    assert node.events("firmware.class_path_unavailable")[0]["level"] == "warning"


def test_placing_again_leaves_identical_files_alone(node: Node) -> None:
    config = node.config(**_with_firmware(node))
    node.agent(config).load()
    node.kernel = node.kernel.reboot()
    node.agent(config).load()

    last = node.events("firmware.placed")[-1]
    assert last["installed"] == []
    assert last["unchanged"] == ["/var/lib/firmware/tenstorrent/fw.bin"]


def test_a_missing_firmware_path_fails_before_loading(node: Node) -> None:
    config = node.config(**_with_firmware(node, firmware_path="/nonexistent"))
    with pytest.raises(AgentError, match="firmwarePath /nonexistent does not exist"):
        node.agent(config).load()
    assert node.kmod_calls("modprobe") == []


@pytest.mark.parametrize(
    ("directory", "searched"),
    [
        ("/lib/firmware", True),
        ("/lib/firmware/", True),
        ("/lib/firmware/updates", True),
        ("/lib/firmware/6.1.0-sim-amd64", True),
        ("/var/lib/firmware", False),
        ("/lib/firmware/vendor", False),
    ],
)
def test_which_directories_the_kernel_searches(directory: str, searched: bool) -> None:
    assert kernel_searches(directory, "6.1.0-sim-amd64") is searched
