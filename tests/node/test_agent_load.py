"""Loading: order, parameters, idempotence, replacing a stale driver, reboots."""

from __future__ import annotations

import pytest

from kmodkit.agent.errors import AgentError, DeviceBusy
from tests.node.harness import DEP, DEVICE, TOP, Node


def test_loads_dependencies_first_and_reports_ready(node: Node) -> None:
    node.image_pair()
    node.agent().load()

    assert node.loaded() == [DEP, TOP]
    modprobes = node.kmod_calls("modprobe")
    assert [c[-1] for c in modprobes] == [DEP, TOP]
    ready = node.events("ready")[0]
    assert ready["version"] == "2.9.0"
    assert [m["module"] for m in ready["modules"]] == [DEP, TOP]
    assert all(m["initstate"] == "live" for m in ready["modules"])


def test_kmm_order_is_honoured_for_softdeps_modprobe_cannot_see(node: Node) -> None:
    # Neither module links against the other, so only the configured order
    # (top first, KMM style) decides: the helper must be loaded first.
    node.image_module(DEP, version="2.9.0")
    node.image_module(TOP, version="2.9.0")
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    node.agent().load()
    assert node.loaded() == [DEP, TOP]


def test_parameters_and_load_args_go_to_the_top_module_only(node: Node) -> None:
    node.image_pair()
    config = node.config(
        modprobe={
            "moduleName": TOP,
            "dirName": str(node.image),
            "modulesLoadingOrder": [TOP, DEP],
            "parameters": ["auto_reset_timeout=5"],
            "args": {"load": ["--first-time"]},
        }
    )
    node.agent(config).load()

    top_call, dep_call = node.kmod_calls("modprobe")[1], node.kmod_calls("modprobe")[0]
    assert top_call[-2:] == (TOP, "auto_reset_timeout=5")
    assert "--first-time" in top_call and "--first-time" in dep_call
    assert dep_call[-1] == DEP
    parameter = node.root / "sys/module/tenstorrent/parameters/auto_reset_timeout"
    assert parameter.read_text().strip() == "5"


def test_single_module_is_one_modprobe_which_resolves_its_dependencies(node: Node) -> None:
    node.image_pair()
    config = node.config(modprobe={"moduleName": TOP, "dirName": str(node.image)})
    node.agent(config).load()

    assert [c[-1] for c in node.kmod_calls("modprobe")] == [TOP]
    assert node.loaded() == [DEP, TOP]


def test_runs_depmod_when_the_image_ships_without_modules_dep(node: Node) -> None:
    node.image_module(DEP, version="2.9.0")
    node.image_module(TOP, version="2.9.0", depends=[DEP], devices=[DEVICE])
    node.agent().load()

    assert node.kmod_calls("depmod") == [("depmod", "-b", str(node.image), node.kernel.release)]
    assert node.events("image.depmod")
    assert node.loaded() == [DEP, TOP]


def test_second_run_at_the_right_version_does_nothing(node: Node) -> None:
    node.image_pair()
    node.agent().load()
    node.kernel.calls.clear()

    node.agent().load()

    assert node.kernel_changes() == []
    assert node.events("load.decision")[-1]["action"] == "nothing"
    assert node.loaded() == [DEP, TOP]


def test_after_a_reboot_the_restarted_agent_loads_again(node: Node) -> None:
    node.image_pair()
    node.agent().load()
    node.kernel = node.kernel.reboot()
    assert node.loaded() == []

    node.agent().load()

    assert node.loaded() == [DEP, TOP]
    assert node.events("load.decision")[-1]["action"] == "load"


def test_a_stale_version_is_replaced_in_reverse_order(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.image_pair("2.9.0")
    node.kernel.calls.clear()

    node.agent().load()

    assert node.events("load.decision")[0]["action"] == "replace"
    removed = [c[-1] for c in node.kmod_calls("rmmod")]
    assert removed == [TOP, DEP]
    assert (node.root / "sys/module/tenstorrent/version").read_text().strip() == "2.9.0"


def test_a_held_stale_driver_is_not_replaced_without_force(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.image_pair("2.9.0")
    node.kernel.open_device(4242, "tt-smi", DEVICE)

    with pytest.raises(DeviceBusy):
        node.agent().load()

    assert (node.root / "sys/module/tenstorrent/version").read_text().strip() == "2.8.0"
    assert node.kernel.kills == []


def test_missing_half_of_a_pair_is_loaded_without_touching_the_other(node: Node) -> None:
    node.preload(DEP, version="2.9.0")
    node.image_pair()
    node.kernel.calls.clear()

    node.agent().load()

    assert node.kmod_calls("rmmod") == []
    assert node.loaded() == [DEP, TOP]


def test_image_without_modules_for_this_kernel_leaves_the_old_driver(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.kernel.calls.clear()

    with pytest.raises(AgentError, match=r"no modules for kernel 6\.1\.0-sim-amd64"):
        node.agent().load()

    assert node.kmod_calls("rmmod") == []
    assert node.loaded() == [DEP, TOP]


def test_image_with_the_wrong_version_leaves_the_old_driver(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.image_pair("2.7.0")
    node.kernel.calls.clear()

    with pytest.raises(AgentError, match=r"carries tenstorrent version 2\.7\.0, expected 2\.9\.0"):
        node.agent().load()

    assert node.kmod_calls("rmmod") == []


def test_image_missing_a_listed_module_fails_before_unloading(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.image_module(TOP, version="2.9.0")
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    node.kernel.calls.clear()

    with pytest.raises(AgentError, match="Module tt_helper not found"):
        node.agent().load()

    assert node.kmod_calls("rmmod") == []


def test_without_an_expected_version_any_loaded_version_is_ready(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.image_pair("2.9.0")
    node.kernel.calls.clear()

    node.agent(node.config(version=None)).load()

    assert node.kernel_changes() == []


def test_a_built_in_module_of_the_same_name_blocks_the_load(node: Node) -> None:
    node.kernel = type(node.kernel)(node.root, builtin=[TOP])
    node.image_pair()

    with pytest.raises(AgentError, match="built into the kernel"):
        node.agent().load()

    assert node.kmod_calls("modprobe") == []


def test_module_names_with_dashes_are_found_under_their_kernel_names(node: Node) -> None:
    node.image_module("tt-helper", version="2.9.0")
    node.image_module(TOP, version="2.9.0", depends=["tt-helper"], devices=[DEVICE])
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    config = node.config(
        modprobe={
            "moduleName": TOP,
            "dirName": str(node.image),
            "modulesLoadingOrder": [TOP, "tt-helper"],
        }
    )
    node.agent(config).load()
    node.kernel.calls.clear()

    node.agent(config).load()

    assert node.kernel_changes() == []
    assert node.loaded() == [DEP, TOP]


def _old_build_loaded(node: Node) -> None:
    """The image's driver at the same version, but another build (srcversion) is loaded:
    what a node keeps when the previous loader pod's unload failed."""
    node.image_module(DEP, version="2.9.0", srcversion="NEWDEP")
    node.image_module(TOP, version="2.9.0", srcversion="NEWTOP", depends=[DEP], devices=[DEVICE])
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    node.preload(DEP, version="2.9.0", srcversion="OLDDEP")
    node.preload(TOP, version="2.9.0", srcversion="OLDTOP", depends=[DEP], devices=[DEVICE])


def test_another_build_of_the_same_version_is_replaced_by_the_images(node: Node) -> None:
    _old_build_loaded(node)

    node.agent().load()

    assert node.kernel.modules[TOP].srcversion == "NEWTOP"
    assert node.kernel.modules[DEP].srcversion == "NEWDEP"
    assert node.events("load.decision")[-1]["action"] == "replace"
    assert node.agent().status() == []


def test_another_build_held_open_is_never_reported_ready(node: Node) -> None:
    _old_build_loaded(node)
    node.kernel.open_device(4242, "train.py", DEVICE)

    with pytest.raises(DeviceBusy, match="pid 4242"):
        node.agent().load()

    assert node.kernel.modules[TOP].srcversion == "OLDTOP"
    problems = node.agent().status()
    assert any("another build" in p and "OLDTOP" in p for p in problems), problems


def test_raw_args_load_and_unload_with_the_modules_own_command_lines(node: Node) -> None:
    node.image_pair()
    image = str(node.image)
    raw = {"load": ["-d", image, TOP], "unload": ["-r", "-d", image, TOP]}
    config = node.config(modprobe={"moduleName": TOP, "dirName": image, "rawArgs": raw})

    node.agent(config).load()
    assert node.loaded() == [DEP, TOP]
    assert ("modprobe", "-d", image, TOP) in node.kernel.calls
    assert node.agent(config).status() == []

    node.agent(config).unload(force=False)
    assert node.loaded() == []
    assert node.kmod_calls("modprobe")[-1] == ("modprobe", "-r", "-d", image, TOP)
