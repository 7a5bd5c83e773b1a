"""In-tree modules listed for removal: loaded ones go, built-in ones are reported."""

from __future__ import annotations

import signal

import pytest

from kmodkit.agent.errors import DeviceBusy
from tests.node.harness import DEP, DEVICE, TOP, Node
from tests.node.simulated_kernel import SimulatedKernel


def test_loaded_in_tree_modules_are_removed_before_loading(node: Node) -> None:
    node.preload("ice", in_tree=True)
    node.image_pair()
    node.kernel.calls.clear()

    node.agent(node.config(inTreeModulesToRemove=["ice"])).load()

    tools = [(c[0], c[-1]) for c in node.kernel.calls if c[0] in ("rmmod", "modprobe")]
    assert tools == [("rmmod", "ice"), ("modprobe", DEP), ("modprobe", TOP)]
    assert node.loaded() == [DEP, TOP]


def test_removes_users_before_the_modules_they_use(node: Node) -> None:
    node.preload("ice", in_tree=True)
    node.preload("irdma", depends=["ice"], in_tree=True)
    node.image_pair()
    node.kernel.calls.clear()

    node.agent(node.config(inTreeModulesToRemove=["ice", "irdma"])).load()

    assert [c[1] for c in node.kmod_calls("rmmod")] == ["irdma", "ice"]


def test_built_in_and_absent_modules_are_reported_not_fought(node: Node) -> None:
    node.kernel = SimulatedKernel(node.root, builtin=["i2c_core"])
    node.image_pair()

    node.agent(node.config(inTreeModulesToRemove=["i2c_core", "nouveau"])).load()

    assert node.kmod_calls("rmmod") == []
    builtin = node.events("in_tree.builtin")
    assert [e["module"] for e in builtin] == ["i2c_core"]
    assert builtin[0]["level"] == "warning"
    assert [e["module"] for e in node.events("in_tree.absent")] == ["nouveau"]
    assert node.loaded() == [DEP, TOP]


def test_builtin_known_only_from_sysfs_is_still_recognised(node: Node) -> None:
    # No modules.builtin entry, but a /sys/module dir without initstate.
    (node.root / "sys/module/drm/parameters").mkdir(parents=True)
    node.image_pair()

    node.agent(node.config(inTreeModulesToRemove=["drm"])).load()

    assert [e["module"] for e in node.events("in_tree.builtin")] == ["drm"]
    assert node.kmod_calls("rmmod") == []


def test_an_in_tree_module_used_by_an_unlisted_module_blocks_the_load(node: Node) -> None:
    node.preload("ice", in_tree=True)
    node.preload("irdma", depends=["ice"], in_tree=True)
    node.image_pair()

    with pytest.raises(DeviceBusy, match=r"ice is used by module.*irdma"):
        node.agent(node.config(inTreeModulesToRemove=["ice"])).load()

    assert node.loaded() == ["ice", "irdma"]


def test_in_tree_module_of_the_same_name_is_swapped_for_ours(node: Node) -> None:
    # The in-tree driver carries no version; ours may not either, so the
    # out-of-tree taint is what tells them apart.
    node.preload(TOP, devices=[DEVICE], in_tree=True)
    node.image_pair()
    config = node.config(version=None, inTreeModulesToRemove=[TOP])
    node.kernel.calls.clear()

    node.agent(config).load()

    assert [c[1] for c in node.kmod_calls("rmmod")] == [TOP]
    assert (node.root / "sys/module/tenstorrent/taint").read_text().strip() == "OE"
    node.kernel.calls.clear()
    node.agent(config).load()
    assert node.kernel_changes() == []


def test_a_held_in_tree_module_is_freed_only_with_force(node: Node) -> None:
    node.preload("tt_legacy", devices=["/dev/tenstorrent/legacy"], in_tree=True)
    node.kernel.open_device(77, "old-daemon", "/dev/tenstorrent/legacy")
    node.image_pair()
    config = node.config(inTreeModulesToRemove=["tt_legacy"])

    with pytest.raises(DeviceBusy, match="old-daemon"):
        node.agent(config).load()
    assert node.loaded() == ["tt_legacy"]

    node.agent(config.model_copy(update={"force_unload": True})).load()
    assert node.kernel.kills == [(77, signal.SIGKILL)]
    assert node.loaded() == [DEP, TOP]
