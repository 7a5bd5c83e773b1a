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
    MODULE_HASH,
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
# Modules with a module loader: the others run no loader pod.
MODULES = {
    key: Module.model_validate(body)
    for key, body in BODIES.items()
    if _parses(body) and "moduleLoader" in body["spec"]
}
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
unloadOnTerminate: false
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
unloadOnTerminate: false
""",
    ("minimal", "default", KERNELS[2]): """\
dkmsModules: []
firmwareHostPath: /var/lib/firmware
inTreeModulesToRemove: []
modprobe:
  dirName: /kmod/opt
  moduleName: mod
unloadOnTerminate: false
""",
}

# Config hashes per (Module, settings), in KERNELS order: a change here gives every
# node a new loader pod (which adopts the loaded module).
PINNED_HASHES = {
    ("container-image-port-no-tag", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("container-image-port-no-tag", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("device-plugin-host-path-outside", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("device-plugin-host-path-outside", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("in-tree-single-and-list", "builtin-fw"): (
        "994974aa33343fb05f3867a9af7a62f9",
        "9f0e31bdc24c4e68d1554b02d460f1d7",
        "8a0b26929e4651a470370ac4451068f1",
    ),
    ("in-tree-single-and-list", "default"): (
        "42bb8126328f88270f21fb2795e3d63b",
        "3e8b833c006ef4528ad2ae2335667b35",
        "b41fbe0701bf2c4c8c1347725fcb0b82",
    ),
    ("kmm", "builtin-fw"): (
        "d206d96775b27d7fa39597a33381edb6",
        "48dd3e0195bbd527daab38efbf14d968",
        "ac682f503de7c93326934e2790c1df15",
    ),
    ("kmm", "default"): (
        "c7988274486f534dc061530087c86aa7",
        "b7c5be44cbff21a77f5b63c0f0db413c",
        "a8e3f12f96bf9ea1d6f7079be63c593f",
    ),
    ("kmodkit", "builtin-fw"): (
        "d206d96775b27d7fa39597a33381edb6",
        "48dd3e0195bbd527daab38efbf14d968",
        "ac682f503de7c93326934e2790c1df15",
    ),
    ("kmodkit", "default"): (
        "c7988274486f534dc061530087c86aa7",
        "b7c5be44cbff21a77f5b63c0f0db413c",
        "a8e3f12f96bf9ea1d6f7079be63c593f",
    ),
    ("max-unavailable-over-100-percent", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("max-unavailable-over-100-percent", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("max-unavailable-zero", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("max-unavailable-zero", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("minimal", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("minimal", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("minimal-full", "builtin-fw"): (
        "988507e5a1ab2f8270c5744c86d911c4",
        "695a055ff28617ab9c591f3ee8c71099",
        "78bab7524a2f177639770d5b93e92d1f",
    ),
    ("minimal-full", "default"): (
        "03d098553faa8a3407c457a96c019b72",
        "34c7b23e83f2291f489d303a9ccb92d9",
        "2956905b929b3d244d076b08ce3f350c",
    ),
    ("name-and-namespace-too-long", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("name-and-namespace-too-long", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("name-not-dns", "builtin-fw"): (
        "01ce9936e90c59805f06da49aa36ec9a",
        "ac8f8055a497dea295e69b7542601462",
        "7f9637ab99d876ccce26569d1242c6ab",
    ),
    ("name-not-dns", "default"): (
        "2a3e49f7838e9426a69f31b6bc13d472",
        "a1d6e8d0b9bf8d26d10473811cc0e21b",
        "8b0138c8f2382aab1f411f25e7f18ab6",
    ),
    ("raw-args-with-module-name", "builtin-fw"): (
        "1fcd98017737e7927d37b5c2ef3133b2",
        "1c06ffb60b6bdfa501d258a497633240",
        "513a7b484ea7479fd5424f61d8ef5ca4",
    ),
    ("raw-args-with-module-name", "default"): (
        "4e069fa8bb57a99569b90fb11aef21e1",
        "06c6a9f8c5a4d84f8d12b368042c8d3e",
        "c6ee16ca2bb5304ba067677a52e44d78",
    ),
    ("toleration-bad-key", "builtin-fw"): (
        "edda9c0745d425116384fe41a641c3de",
        "571852d27461cf4645b8121f3e70d841",
        "5e277ce1f6c19649c43aa290a244b3de",
    ),
    ("toleration-bad-key", "default"): (
        "edcce52ee2841807d2cee43796d9c8a4",
        "ca4f736b9a720ebb31b84c97f397f7d7",
        "772a650052bfd87cb15bcb2572823bba",
    ),
    ("toleration-bad-value", "builtin-fw"): (
        "3294f081a93d38d6d222ddb3b4ffd8d6",
        "1959d8d20fd4de08ca1c1a6bebe18d59",
        "1ddcaf1dae390a0b1cdb7d81b1338270",
    ),
    ("toleration-bad-value", "default"): (
        "443ac5d0a4ea05d030edc0e98454e7b9",
        "d74ed91ff885c4c9b350c527769e7b97",
        "0b296682f6c16ec6be3957a3df4927c5",
    ),
    ("toleration-empty-key-equal", "builtin-fw"): (
        "40da96c8271d4ef63696fcb8930e7c41",
        "47a7f4f22c762df9494f6ee479e7c424",
        "10069c7e4b7a0a4cd094ea724d8ddc39",
    ),
    ("toleration-empty-key-equal", "default"): (
        "df60290c6b0b0e5203eecea3ec50bdd7",
        "a858d360e0b78a57defe92698a172ebf",
        "9c64c06d5629d8faf933041c244cbfe3",
    ),
    ("toleration-exists-with-value", "builtin-fw"): (
        "8ab4b4941e4ffa8354bf0d5d54d0cbd9",
        "ce7ea7c32762931001cb293287139cc3",
        "5613542c2828e57fc3744178ab78c6c7",
    ),
    ("toleration-exists-with-value", "default"): (
        "ecdd51c15f390460e5fd4c66b1e3ab6d",
        "a4b06e3ea33ea535fd86037513a18641",
        "53627b1e09deb815a18b1a9c9234f0ad",
    ),
    ("toleration-seconds-without-noexecute", "builtin-fw"): (
        "99e74b00a4ff4049ea90871729e1d747",
        "1ffff353c2cf9c81b8ac2c2829e1d99c",
        "28cbee38b5828bca4b951915c1d8d5ee",
    ),
    ("toleration-seconds-without-noexecute", "default"): (
        "ebca91e1fef8b55a2129f10df55ae757",
        "aa90151dd2e37a45acbf91e85a431e16",
        "424af9cd0e35b61471bed52a1ca5c9ae",
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


PINNED_MODULE_HASHES: dict[tuple[str, str], tuple[str, ...]] = {
    ("container-image-port-no-tag", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("container-image-port-no-tag", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("kmm", "builtin-fw"): (
        "1663c395c01ca3026b6d029b278fd64f",
        "4002ade63440bf2ca9e1766f24f25888",
        "dba71550e30067e579ea17aed78cd544",
    ),
    ("kmm", "default"): (
        "fe75539e28197498b15e4a785e93da8e",
        "e8487e3b2d3947153fc19826eea1fab3",
        "20c04d7d026e37f8841946f2e764b07a",
    ),
    ("kmodkit", "builtin-fw"): (
        "1663c395c01ca3026b6d029b278fd64f",
        "4002ade63440bf2ca9e1766f24f25888",
        "dba71550e30067e579ea17aed78cd544",
    ),
    ("kmodkit", "default"): (
        "fe75539e28197498b15e4a785e93da8e",
        "e8487e3b2d3947153fc19826eea1fab3",
        "20c04d7d026e37f8841946f2e764b07a",
    ),
    ("max-unavailable-over-100-percent", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("max-unavailable-over-100-percent", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("max-unavailable-zero", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("max-unavailable-zero", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("minimal-full", "builtin-fw"): (
        "37bbbc49521777774584753a1801cf9f",
        "b85e11e38bea1a152d970e8db44ff63a",
        "069f6d92d5d3464339e4c95e8d3d1efa",
    ),
    ("minimal-full", "default"): (
        "05c94c9a9afb73a25d81bb1c27e675c9",
        "6fd8c4f8f62a375c215286bea0fd5a4c",
        "b8767780b625e4240794e75f64a25217",
    ),
    ("minimal", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("minimal", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("name-and-namespace-too-long", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("name-and-namespace-too-long", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("name-not-dns", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("name-not-dns", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("toleration-bad-key", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("toleration-bad-key", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("toleration-bad-value", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("toleration-bad-value", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("toleration-empty-key-equal", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("toleration-empty-key-equal", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("toleration-exists-with-value", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("toleration-exists-with-value", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
    ("toleration-seconds-without-noexecute", "builtin-fw"): (
        "cd172ebd972d4d9d70298d37b3ad22c8",
        "102a395c814e0c9ef52f5dac538f007d",
        "e0df39660612ecd42f2fd2875a1de683",
    ),
    ("toleration-seconds-without-noexecute", "default"): (
        "9b236a076d904457e1aa6772c31241e6",
        "5de71908146380e5f8e99a7c57d2b654",
        "417050ad3ddcc23e58d70c45e96a7bf6",
    ),
}


@pytest.mark.parametrize(("key", "settings"), list(PINNED_HASHES))
def test_config_hash_is_pinned(key: str, settings: str) -> None:
    pods = loader_pods(key, settings)
    assert [p["metadata"]["annotations"][KERNEL] for p in pods] == list(KERNELS)
    hashes = tuple(p["metadata"]["annotations"][CONFIG_HASH] for p in pods)
    assert hashes == PINNED_HASHES[key, settings]


@pytest.mark.parametrize(("key", "settings"), list(PINNED_MODULE_HASHES))
def test_module_hash_is_pinned(key: str, settings: str) -> None:
    """A change here reloads the driver on every node an operator upgrade reaches."""
    hashes = tuple(p["metadata"]["annotations"][MODULE_HASH] for p in loader_pods(key, settings))
    assert hashes == PINNED_MODULE_HASHES[key, settings]


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
        # Deleting a loader pod never unloads: only an unloader pod does.
        assert not config.unload_on_terminate


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
    # Whatever runs there stays, as with any spec the engine cannot apply, and
    # the ready label says what is true of it.
    assert not result.delete
    assert result.node_labels == {"n0": {labels.READY.key("ns", "mod"): ""}}
    assert {(o.phase, o.reason) for o in result.outcomes} == {(Phase.FAILED, "InvalidAgentConfig")}
    assert all(
        o.message.startswith("spec.moduleLoader.container.modprobe") and why in o.message
        for o in result.outcomes
    )
