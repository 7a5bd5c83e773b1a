"""Unloading: refuse while held and name the holders; force kills exactly them."""

from __future__ import annotations

import signal

import pytest

from kmodkit.agent.errors import ConfigError, DeviceBusy
from tests.node.harness import DEP, DEVICE, TOP, Node


@pytest.fixture
def loaded(node: Node) -> Node:
    node.image_pair()
    node.agent().load()
    node.kernel.calls.clear()
    return node


def test_unloads_in_reverse_loading_order(loaded: Node) -> None:
    loaded.agent().unload(force=False)

    assert [c[1] for c in loaded.kmod_calls("rmmod")] == [TOP, DEP]
    assert loaded.loaded() == []
    assert not (loaded.root / "sys/module/tenstorrent").exists()


def test_unload_with_nothing_loaded_succeeds_quietly(node: Node) -> None:
    node.agent().unload(force=False)

    assert node.kernel.calls == []
    assert node.events("unload.nothing_loaded")


def test_refuses_while_the_device_is_open_and_names_the_holders(loaded: Node) -> None:
    loaded.kernel.open_device(4242, "tt-smi", DEVICE, cmdline=["/usr/local/bin/tt-smi", "-s"])
    loaded.kernel.spawn(555, "bash", ["/dev/null", "/dev/pts/0"])

    with pytest.raises(DeviceBusy) as refused:
        loaded.agent().unload(force=False)

    assert loaded.kmod_calls("rmmod") == []
    assert loaded.kernel.kills == []
    assert loaded.loaded() == [DEP, TOP]
    assert "pid 4242 (tt-smi) on /dev/tenstorrent/0" in refused.value.message
    assert refused.value.fields["holders"] == [
        {
            "pid": 4242,
            "comm": "tt-smi",
            "cmdline": "/usr/local/bin/tt-smi -s",
            "devices": [DEVICE],
        }
    ]
    assert refused.value.fields["refcnt"] == {TOP: 1}


def test_a_refusal_names_the_bound_devices_and_how_to_unbind_them(loaded: Node) -> None:
    loaded.kernel.bind_device(TOP, "pci", "0000:03:00.0")
    loaded.kernel.open_device(4242, "tt-smi", DEVICE)

    with pytest.raises(DeviceBusy) as refused:
        loaded.agent().unload(force=False)

    assert (
        "bound devices: 0000:03:00.0 (pci driver tenstorrent; to unbind: "
        "echo 0000:03:00.0 > /sys/bus/pci/drivers/tenstorrent/unbind)"
    ) in refused.value.message
    assert refused.value.fields["bound_devices"] == ["pci:tenstorrent:0000:03:00.0"]


def test_force_kills_exactly_the_holders_then_unloads(loaded: Node) -> None:
    loaded.kernel.open_device(4242, "tt-smi", DEVICE)
    loaded.kernel.open_device(4343, "python3", DEVICE, cmdline=["python3", "infer.py"])
    loaded.kernel.spawn(555, "bash", ["/dev/null"])
    loaded.kernel.spawn(1, "systemd", ["/dev/kmsg"])

    loaded.agent().unload(force=True)

    assert loaded.kernel.kills == [(4242, signal.SIGKILL), (4343, signal.SIGKILL)]
    assert (loaded.root / "proc/555").exists() and (loaded.root / "proc/1").exists()
    assert [c[1] for c in loaded.kmod_calls("rmmod")] == [TOP, DEP]
    killed = [e["pid"] for e in loaded.events("holder.killed")]
    assert killed == [4242, 4343]


def test_force_gives_up_when_a_holder_does_not_die(loaded: Node) -> None:
    loaded.kernel.open_device(4242, "stuck", DEVICE, unkillable=True)

    with pytest.raises(DeviceBusy, match="still busy") as refused:
        loaded.agent().unload(force=True)

    assert loaded.kernel.kills == [(4242, signal.SIGKILL)]
    assert loaded.kmod_calls("rmmod") == []
    assert [h["pid"] for h in refused.value.fields["holders"]] == [4242]


def test_force_refuses_when_no_holder_is_visible(loaded: Node) -> None:
    loaded.kernel.hold_invisibly(TOP)

    with pytest.raises(DeviceBusy, match="hostPID"):
        loaded.agent().unload(force=True)

    assert loaded.kernel.kills == []
    assert loaded.loaded() == [DEP, TOP]


def test_a_module_we_do_not_manage_using_ours_blocks_without_killing(loaded: Node) -> None:
    loaded.preload("tt_extra", depends=[TOP])
    loaded.kernel.open_device(4242, "tt-smi", DEVICE)

    with pytest.raises(DeviceBusy, match="used by module") as refused:
        loaded.agent().unload(force=True)

    assert refused.value.fields["module_users"] == {TOP: ["tt_extra"]}
    assert loaded.kernel.kills == []
    assert loaded.kmod_calls("rmmod") == []


def test_references_between_our_own_modules_are_not_holders(loaded: Node) -> None:
    # tt_helper's refcnt is 1 because tenstorrent uses it: not a reason to refuse.
    assert (loaded.root / "sys/module/tt_helper/refcnt").read_text().strip() == "1"
    loaded.agent().unload(force=False)
    assert loaded.loaded() == []


def test_never_forces_rmmod(loaded: Node) -> None:
    loaded.kernel.open_device(4242, "tt-smi", DEVICE)
    with pytest.raises(DeviceBusy):
        loaded.agent().unload(force=False)
    loaded.agent().unload(force=True)

    assert all(call == ("rmmod", call[1]) for call in loaded.kmod_calls("rmmod"))


def test_force_unload_from_config_applies_when_replacing(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.image_pair("2.9.0")
    node.kernel.open_device(4242, "tt-smi", DEVICE)

    node.agent(node.config(forceUnload=True)).load()

    assert node.kernel.kills == [(4242, signal.SIGKILL)]
    assert (node.root / "sys/module/tenstorrent/version").read_text().strip() == "2.9.0"


def test_firmware_placed_by_the_image_is_removed_on_unload(node: Node) -> None:
    node.image_pair(firmware=["tenstorrent/fw.bin"])
    (node.image_firmware / "tenstorrent").mkdir(parents=True)
    (node.image_firmware / "tenstorrent/fw.bin").write_bytes(b"blob")
    config = node.config(
        modprobe={
            "moduleName": TOP,
            "dirName": str(node.image),
            "modulesLoadingOrder": [TOP, DEP],
            "firmwarePath": str(node.image_firmware),
        }
    )
    node.agent(config).load()
    placed = node.root / "var/lib/firmware/tenstorrent/fw.bin"
    assert placed.read_bytes() == b"blob"

    node.agent(config).unload(force=False)

    assert not placed.exists()
    assert placed.parent.is_dir()


def test_unload_arguments_unload_with_modprobe_and_its_dependencies_too(node: Node) -> None:
    # modulesLoadingOrder names only the driver: modprobe pulled its dependency in.
    node.image_pair()
    only_top = {"moduleName": TOP, "dirName": str(node.image)}
    node.agent(node.config(modprobe=only_top)).load()
    assert node.loaded() == [DEP, TOP]

    node.agent(node.config(modprobe=only_top)).unload(force=False)
    assert node.loaded() == [DEP], "rmmod removes only what the agent loaded by name"

    node.agent(node.config(modprobe=only_top)).load()
    with_args = {**only_top, "args": {"unload": ["--wait=5000"]}}
    node.agent(node.config(modprobe=with_args)).unload(force=False)
    assert node.loaded() == []
    (call,) = node.kmod_calls("modprobe")[-1:]
    assert call[:2] == ("modprobe", "-r") and "--wait=5000" in call


def test_unload_arguments_never_force(node: Node) -> None:
    for forced in (["-f"], ["-rf"], ["--force"], ["--force-modversion"]):
        with pytest.raises(ConfigError, match="must not force"):
            node.config(modprobe={"moduleName": TOP, "args": {"unload": forced}})
