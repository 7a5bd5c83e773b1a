"""The node agent's configuration in loader pods: what the agent reads, and its bytes.

The config hash covers the configuration, so one changed byte in it gives
every loader pod a new hash: an operator upgrade would then recreate every
loader pod and reload the driver on the whole fleet. The pinned documents and
hashes below are what the operator emitted while it still wrote the
configuration as a plain dict; changing one is a fleet-wide reload and must be
deliberate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kmodkit.agent.config import AgentConfig, parse_config
from kmodkit.core import labels
from kmodkit.core.api import Module
from kmodkit.core.engine.kernel_mapping import ResolvedMapping, resolve
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus, LoaderPlan, Phase, plan
from kmodkit.core.engine.loader_pod import (
    AGENT_CONFIG,
    CONFIG_HASH,
    FIRMWARE_STAGING,
    KERNEL,
    STAGING,
    LoaderPod,
    LoaderSettings,
)
from kmodkit.core.nodes import NodeView
from tests.unit.examples import kmm_example, kmodkit_example, minimal
from tests.unit.module_cases import CASES

SETTINGS = {
    "default": LoaderSettings(agent_image="registry.example.com/kmodkit/agent:1"),
    # A firmware directory the kernel searches anyway: the unprivileged pod.
    "builtin-fw": LoaderSettings(
        agent_image="registry.example.com/kmodkit/agent:1", firmware_host_path="/lib/firmware"
    ),
}
# One kernel per kind of mapping in the KMM example: the literal with the
# container's image, the el9 regexp with its own image, build and in-tree list,
# and the catch-all regexp.
KERNELS = ("6.8.0-45-generic", "6.12.0-55.9.1.el9_5.x86_64", "6.5.0-1-generic")

BODIES: dict[str, dict[str, Any]] = {
    "kmm": kmm_example(),
    "kmodkit": kmodkit_example(),
    "minimal": minimal(),
    "minimal-full": minimal(
        modprobe={
            "moduleName": "mod",
            "dirName": "/usr",
            "parameters": ["a=1", "b=2"],
            "args": {"load": ["-v"], "unload": ["-v"]},
            "firmwarePath": "/fw",
            "modulesLoadingOrder": ["mod", "dep"],
        },
        inTreeModulesToRemove=["old"],
        version="2",
    ),
    **{case.id: case.build("ns") for case in CASES},
}


def _parses(body: Mapping[str, Any]) -> bool:
    try:
        Module.model_validate(body)
    except ValidationError:
        return False
    return True


# The operator plans only what parses (anything else gets an "invalid" status);
# what admission alone rejects does reach the planner.
MODULES = {key: Module.model_validate(body) for key, body in BODIES.items() if _parses(body)}
# What the node agent would refuse: admission rejects these, the schema does not.
REFUSED_BY_AGENT = {
    "loading-order-too-short": "needs at least 2 entries",
    "loading-order-wrong-first": "must start with modprobe.moduleName",
    "loading-order-duplicates": "duplicate entries",
    "neither-module-name-nor-raw-args": "moduleName",
}

# The full KMM example on its literal mapping, on the el9 mapping (whose own
# in-tree list replaces the container's), and the smallest Module.
PINNED_YAML = {
    ("kmodkit", "default", KERNELS[0]): """\
dkmsModules: []
firmwareHostPath: /var/lib/firmware
inTreeModulesToRemove:
- xe
- i915
modprobe:
  args:
    load:
    - --first-time
    unload:
    - --wait=5000
  dirName: /kmod/opt
  firmwarePath: /kmod/firmware
  moduleName: xe
  modulesLoadingOrder:
  - xe
  - intel_vsec
  - drm_gpuvm
  parameters:
  - enable_guc=3
unloadOnTerminate: true
""",
    ("kmodkit", "builtin-fw", KERNELS[1]): """\
dkmsModules: []
firmwareHostPath: /lib/firmware
inTreeModulesToRemove:
- i915
modprobe:
  args:
    load:
    - --first-time
    unload:
    - --wait=5000
  dirName: /kmod/opt
  firmwarePath: /kmod/firmware
  moduleName: xe
  modulesLoadingOrder:
  - xe
  - intel_vsec
  - drm_gpuvm
  parameters:
  - enable_guc=3
unloadOnTerminate: true
""",
    ("minimal", "default", KERNELS[2]): """\
dkmsModules: []
firmwareHostPath: /var/lib/firmware
inTreeModulesToRemove: []
modprobe:
  dirName: /kmod/opt
  moduleName: mod
unloadOnTerminate: true
""",
}

# Config hashes per (Module, settings), in KERNELS order.
PINNED_HASHES = {
    ("container-image-port-no-tag", "builtin-fw"): (
        "bccb9cdccf43a4af3b588bb14cdf0c9b",
        "fe1434b03f9ae203b58146315b6df5e2",
        "f2d3f883bab6fe2c2594b5615d6d0c25",
    ),
    ("container-image-port-no-tag", "default"): (
        "682bb51f3a6a51c5288dfbeb66c6de8d",
        "53f4d8642b4c9a04e59d175bb566f772",
        "3c4122141b9ceddb8bd4846aafcabcdd",
    ),
    ("kmm", "builtin-fw"): (
        "8676844afcad5edd9faa99e15d9dc03f",
        "82e52207536b1d8fea03e95e5b97b318",
        "6f8ccce3c7efdf73489739a8c727c4bb",
    ),
    ("kmm", "default"): (
        "7964747d31a3372cee097442c18cd4ab",
        "bc3b960ee92363c08632a0e835f48a90",
        "659d037184c83b8d05fe218cfbf3a284",
    ),
    ("kmodkit", "builtin-fw"): (
        "8676844afcad5edd9faa99e15d9dc03f",
        "82e52207536b1d8fea03e95e5b97b318",
        "6f8ccce3c7efdf73489739a8c727c4bb",
    ),
    ("kmodkit", "default"): (
        "7964747d31a3372cee097442c18cd4ab",
        "bc3b960ee92363c08632a0e835f48a90",
        "659d037184c83b8d05fe218cfbf3a284",
    ),
    ("max-unavailable-over-100-percent", "builtin-fw"): (
        "bccb9cdccf43a4af3b588bb14cdf0c9b",
        "fe1434b03f9ae203b58146315b6df5e2",
        "f2d3f883bab6fe2c2594b5615d6d0c25",
    ),
    ("max-unavailable-over-100-percent", "default"): (
        "682bb51f3a6a51c5288dfbeb66c6de8d",
        "53f4d8642b4c9a04e59d175bb566f772",
        "3c4122141b9ceddb8bd4846aafcabcdd",
    ),
    ("max-unavailable-zero", "builtin-fw"): (
        "bccb9cdccf43a4af3b588bb14cdf0c9b",
        "fe1434b03f9ae203b58146315b6df5e2",
        "f2d3f883bab6fe2c2594b5615d6d0c25",
    ),
    ("max-unavailable-zero", "default"): (
        "682bb51f3a6a51c5288dfbeb66c6de8d",
        "53f4d8642b4c9a04e59d175bb566f772",
        "3c4122141b9ceddb8bd4846aafcabcdd",
    ),
    ("minimal-full", "builtin-fw"): (
        "b0c9ef5d3a2e732ab063dda6d89f4210",
        "139a4b9d5ad809ebafc7734394bc1904",
        "a379fce730e755de7f1bfc60dc79ca25",
    ),
    ("minimal-full", "default"): (
        "c2748b0c42f6fc4de944984a2522a3a5",
        "ce947904a32444815b98cc9576bdd9e8",
        "d2392234367420e70dd95187aaa89744",
    ),
    ("minimal", "builtin-fw"): (
        "bccb9cdccf43a4af3b588bb14cdf0c9b",
        "fe1434b03f9ae203b58146315b6df5e2",
        "f2d3f883bab6fe2c2594b5615d6d0c25",
    ),
    ("minimal", "default"): (
        "682bb51f3a6a51c5288dfbeb66c6de8d",
        "53f4d8642b4c9a04e59d175bb566f772",
        "3c4122141b9ceddb8bd4846aafcabcdd",
    ),
    ("name-and-namespace-too-long", "builtin-fw"): (
        "bccb9cdccf43a4af3b588bb14cdf0c9b",
        "fe1434b03f9ae203b58146315b6df5e2",
        "f2d3f883bab6fe2c2594b5615d6d0c25",
    ),
    ("name-and-namespace-too-long", "default"): (
        "682bb51f3a6a51c5288dfbeb66c6de8d",
        "53f4d8642b4c9a04e59d175bb566f772",
        "3c4122141b9ceddb8bd4846aafcabcdd",
    ),
    ("name-not-dns", "builtin-fw"): (
        "bccb9cdccf43a4af3b588bb14cdf0c9b",
        "fe1434b03f9ae203b58146315b6df5e2",
        "f2d3f883bab6fe2c2594b5615d6d0c25",
    ),
    ("name-not-dns", "default"): (
        "682bb51f3a6a51c5288dfbeb66c6de8d",
        "53f4d8642b4c9a04e59d175bb566f772",
        "3c4122141b9ceddb8bd4846aafcabcdd",
    ),
    ("toleration-bad-key", "builtin-fw"): (
        "bfad66dd961bccb16b3ce8a6a03f1c17",
        "326194568e8665a6b78193e67bc2d2c2",
        "f4e809594601347533628be6a5d445cb",
    ),
    ("toleration-bad-key", "default"): (
        "0cc2af5b897ee6663c53321821d01ba3",
        "f9dc6ea8c2e1cf9c753b7183d084b777",
        "d232a027b46de47b3a78d6f420701691",
    ),
    ("toleration-bad-value", "builtin-fw"): (
        "f0e39b3f484af7c760d4e757c8413271",
        "d9e1df6e04bb049e2ec3d0b9d104e36d",
        "ac5418ee266d7bf1fca9b82889464473",
    ),
    ("toleration-bad-value", "default"): (
        "6cd2fe7b32cd030a464651b388c67db7",
        "8b9e91efb72d213f5272a614408aba4d",
        "9c666a47ac7ccaa8139c50285ba80846",
    ),
    ("toleration-empty-key-equal", "builtin-fw"): (
        "4af9f22412700d19b6630210d6ef8097",
        "0b3fdd99d21359b88d29f5dfbee445ac",
        "0fcb376915c2943b52df640d509b2904",
    ),
    ("toleration-empty-key-equal", "default"): (
        "306b789de37db0012d50ebe9683689b0",
        "7f68c0a82598e59bb28c7ddf7443da36",
        "7ee697f661365375c591ae0b0e6f1dee",
    ),
    ("toleration-exists-with-value", "builtin-fw"): (
        "2e3e138035cff6522db41d045e59b6ef",
        "5014ba511257e567eddf49f13e799598",
        "5fba80a9c78b0ceaff8d1937ea21ae0e",
    ),
    ("toleration-exists-with-value", "default"): (
        "5e4888b5bd95901e93d4d3c4c268d435",
        "0f56d111596b62b7e31318c3bd299170",
        "15720e5431844f82f2c854e19cf7ec33",
    ),
    ("toleration-seconds-without-noexecute", "builtin-fw"): (
        "56139814be64194e017746dd74b0bbc8",
        "817d60597bf4e6a51f2cf4276b36e7aa",
        "186180cda3edc3920db5b40f10bfe630",
    ),
    ("toleration-seconds-without-noexecute", "default"): (
        "54dc3bacddca4c8f14f0c3f9e807ac09",
        "4ea850107729dbf1feb0441d49ae3c5a",
        "d75de37c8aecaf4f1d21e4fb09858319",
    ),
}


def nodes(module: Module) -> list[NodeView]:
    """One selected node per kernel, labelled for the Module's version if it has one."""
    ns, name = module.metadata.namespace or "", module.metadata.name or ""
    version = module.spec.module_loader.container.version
    wanted = {labels.MODULE_VERSION.key(ns, name): version} if version else {}
    return [
        NodeView(f"n{i}", {**module.spec.selector, **wanted}, kernel, "amd64", ready=True)
        for i, kernel in enumerate(KERNELS)
    ]


def first_load(module: Module, settings: LoaderSettings, pods: list[LoaderPod]) -> LoaderPlan:
    """The plan once every image the first pass asks about exists."""
    fleet = nodes(module)
    needed = plan(module, fleet, pods, {}, settings).needed_images
    return plan(module, fleet, pods, {i: ImageStatus(ImageState.EXISTS) for i in needed}, settings)


def loader_pods(key: str, settings: str) -> list[dict[str, Any]]:
    return first_load(MODULES[key], SETTINGS[settings], []).create


def agent_yaml(pod: Mapping[str, Any]) -> str:
    """The file the agent is started with, followed from its --config argument
    through the mount and the downward-API volume to the annotation it shows."""
    spec = pod["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    command = agent["command"]
    path = command[command.index("--config") + 1]
    mount = next(m for m in agent["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    item = next(
        i for i in volume["downwardAPI"]["items"] if f"{mount['mountPath']}/{i['path']}" == path
    )
    field = item["fieldRef"]["fieldPath"]
    prefix, suffix = "metadata.annotations['", "']"
    assert field.startswith(prefix) and field.endswith(suffix), field
    annotation: str = pod["metadata"]["annotations"][field[len(prefix) : -len(suffix)]]
    return annotation


def parsed_config(pod: Mapping[str, Any]) -> AgentConfig:
    return parse_config(yaml.safe_load(agent_yaml(pod)), source=pod["metadata"]["name"])


@pytest.mark.parametrize(("key", "settings", "kernel"), list(PINNED_YAML))
def test_agent_yaml_is_pinned_byte_for_byte(key: str, settings: str, kernel: str) -> None:
    pod = next(
        p for p in loader_pods(key, settings) if p["metadata"]["annotations"][KERNEL] == kernel
    )
    assert pod["metadata"]["annotations"][AGENT_CONFIG] == PINNED_YAML[key, settings, kernel]
    assert agent_yaml(pod) == PINNED_YAML[key, settings, kernel]


@pytest.mark.parametrize(("key", "settings"), list(PINNED_HASHES))
def test_config_hash_is_pinned(key: str, settings: str) -> None:
    pods = loader_pods(key, settings)
    assert [p["metadata"]["annotations"][KERNEL] for p in pods] == list(KERNELS)
    hashes = tuple(p["metadata"]["annotations"][CONFIG_HASH] for p in pods)
    assert hashes == PINNED_HASHES[key, settings]


def test_every_module_that_loads_is_pinned() -> None:
    loading = {
        (key, settings) for key in MODULES for settings in SETTINGS if loader_pods(key, settings)
    }
    assert loading == set(PINNED_HASHES)


def _resolved(module: Module, kernel: str) -> ResolvedMapping:
    resolved = resolve(module, kernel)
    assert isinstance(resolved, ResolvedMapping)
    return resolved


@pytest.mark.parametrize("settings", list(SETTINGS))
@pytest.mark.parametrize("key", list(MODULES))
def test_each_loader_pod_config_validates_and_says_what_the_module_says(
    key: str, settings: str
) -> None:
    module = MODULES[key]
    modprobe = module.spec.module_loader.container.modprobe
    for pod in loader_pods(key, settings):
        config = parsed_config(pod)
        kernel = pod["metadata"]["annotations"][KERNEL]
        assert config.modprobe.module_name == modprobe.module_name
        # KMM lists the top module first; dependencies load before it.
        order = modprobe.modules_loading_order or [modprobe.module_name]
        assert config.loading_order == tuple(reversed(order))
        assert config.modprobe.dir_name == f"{STAGING}{modprobe.dir_name}"
        assert config.modprobe.parameters == (modprobe.parameters or [])
        assert config.modprobe.args.load == (modprobe.args.load if modprobe.args else [])
        assert config.modprobe.args.unload == (modprobe.args.unload if modprobe.args else [])
        assert config.modprobe.firmware_path == (
            FIRMWARE_STAGING if modprobe.firmware_path else None
        )
        assert config.firmware_host_path == SETTINGS[settings].firmware_host_path
        assert config.in_tree_modules_to_remove == list(
            _resolved(module, kernel).in_tree_modules_to_remove
        )
        # A KMM version is an admin's label, not MODULE_VERSION; no DKMS, no node build.
        assert (config.version, config.dkms_names, config.build) == (None, [], None)
        assert config.unload_on_terminate


def test_the_modules_checked_reach_every_config_setting() -> None:
    """Guards the test above against passing on Modules that set nothing."""
    configs = [parsed_config(pod) for key in MODULES for pod in loader_pods(key, "default")]
    assert any(len(c.loading_order) > 1 for c in configs)
    assert any(c.modprobe.firmware_path for c in configs)
    assert any(c.modprobe.parameters and c.modprobe.args.load for c in configs)
    assert {tuple(c.in_tree_modules_to_remove) for c in configs} >= {(), ("i915",), ("xe", "i915")}


@pytest.mark.parametrize(("key", "why"), list(REFUSED_BY_AGENT.items()))
def test_a_module_the_agent_would_refuse_gets_a_node_failure_not_a_loader_pod(
    key: str, why: str
) -> None:
    module = MODULES[key]
    old = LoaderPod("mod-loader-n0", "n0", "old-hash", KERNELS[0], "", ready=True)
    result = first_load(module, SETTINGS["default"], [old])
    assert not result.create and not result.needed_images
    # Whatever runs there stays, as with any spec the engine cannot apply.
    assert not result.delete and not result.node_labels
    assert {(o.phase, o.reason) for o in result.outcomes} == {(Phase.FAILED, "InvalidAgentConfig")}
    assert all(
        o.message.startswith("spec.moduleLoader.container.modprobe") and why in o.message
        for o in result.outcomes
    )
