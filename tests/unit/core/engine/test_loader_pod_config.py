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
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("container-image-port-no-tag", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("device-plugin-host-path-outside", "builtin-fw"): (
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("device-plugin-host-path-outside", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("in-tree-single-and-list", "builtin-fw"): (
        "9155578b5e697cb28793904834f44abd",
        "df6dbbb0e6bf63171d938761ce05865f",
        "289be4e8012fa38ce2a6b323eba05ea2",
    ),
    ("in-tree-single-and-list", "default"): (
        "ea4f81c5fdf557bfa33817f1eb7a7e86",
        "843fc6fb40f0d2f5a69d7beb87bdda3f",
        "66b5ce9862a886eed63c3088105fc1d0",
    ),
    ("kmm", "builtin-fw"): (
        "f5a11e1e8bd1b90c882fd95fe710c4f8",
        "6aea215a616d47a274eebac144e47108",
        "fef623ef947e507571af0b2abdc74311",
    ),
    ("kmm", "default"): (
        "564966f3c6bbd33f748114e006376431",
        "4f100e83d3a3ec3de3ed2e6aa9877e75",
        "4160f1ade0ceb347e12d705a2e82e7ba",
    ),
    ("kmodkit", "builtin-fw"): (
        "f5a11e1e8bd1b90c882fd95fe710c4f8",
        "6aea215a616d47a274eebac144e47108",
        "fef623ef947e507571af0b2abdc74311",
    ),
    ("kmodkit", "default"): (
        "564966f3c6bbd33f748114e006376431",
        "4f100e83d3a3ec3de3ed2e6aa9877e75",
        "4160f1ade0ceb347e12d705a2e82e7ba",
    ),
    ("max-unavailable-over-100-percent", "builtin-fw"): (
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("max-unavailable-over-100-percent", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("max-unavailable-zero", "builtin-fw"): (
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("max-unavailable-zero", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("minimal", "builtin-fw"): (
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("minimal", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("minimal-full", "builtin-fw"): (
        "2383f144abb5df780758dfab1deac35a",
        "aba19fbb19707511eef238b83218de8f",
        "f4972ef459e61649a0a124eeef3c05c3",
    ),
    ("minimal-full", "default"): (
        "c9cc862f0b144778e795e19b084b8856",
        "42d0177c37b3ad08d8eff83a5c543187",
        "2b75015c5c19817e97d9e75cace459c0",
    ),
    ("name-and-namespace-too-long", "builtin-fw"): (
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("name-and-namespace-too-long", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("name-not-dns", "builtin-fw"): (
        "6b565cbb51e7541ef9453d15d06574d7",
        "8f2507070a4d44af3e3afc0786176421",
        "888ad222130a9a8310aebbb9c15beaa9",
    ),
    ("name-not-dns", "default"): (
        "e5d736bd82b54712cc1522fb2b0b77f1",
        "2248d6fc79b34b7fdc8bdc9052246340",
        "5da7a53912899d001f1dc54adccbfb21",
    ),
    ("raw-args-with-module-name", "builtin-fw"): (
        "20c636ba8fd43adacd79a050b2265553",
        "0f05ad0dc203b7a9925ea79001aa0c8a",
        "5d4d23a992ede3eb58bed53834cf1b77",
    ),
    ("raw-args-with-module-name", "default"): (
        "99100f0f274ab2217c42f361ccc26757",
        "008747913f70415a909e48110eeb0ee9",
        "90a9ad4f4112ffa04121cf157e874c65",
    ),
    ("toleration-bad-key", "builtin-fw"): (
        "8cab5bf40514e19b22a82e37f4023908",
        "725e862889aefc8b8554cf7eddda0046",
        "f2ac691d24799c9e1f1204ba79fa6ffd",
    ),
    ("toleration-bad-key", "default"): (
        "5d7805bf43f4f96122042263123e21b5",
        "d4f88c7be1e2440fd10b51bd7a68b05e",
        "bf28aa8e806171a10aab38bfeb089750",
    ),
    ("toleration-bad-value", "builtin-fw"): (
        "5de9fa9e69b9e4568416f0455e4cca92",
        "d4a796f304c8a92ce1e4f566d5fe9110",
        "74e54556704676cfe3eb924a6f688e94",
    ),
    ("toleration-bad-value", "default"): (
        "40238a3cc54620477b7dc85d21919445",
        "7fd4ce1930d4b8f368ff197131192fb5",
        "367008b08628575c4f3cd1c9cf7ac68d",
    ),
    ("toleration-empty-key-equal", "builtin-fw"): (
        "df2b6e0f6bce7965f3e83563662d2c68",
        "05381dfa04e9e12034e35143a6d94967",
        "5deeaf423f361fb51cacbdb97e741695",
    ),
    ("toleration-empty-key-equal", "default"): (
        "6cf1f80ea699df923e934d762a5f4e12",
        "12758132e55c883a80fb06a228151948",
        "e182568e3a96f6e5da573dde42c1a173",
    ),
    ("toleration-exists-with-value", "builtin-fw"): (
        "440ad69f463d66cb8ae8b3f01b07b9d6",
        "443b4409ddda451dbf6cb417b5a92ec4",
        "3d6fa1ec7faf1d6becaaf7e009cc770a",
    ),
    ("toleration-exists-with-value", "default"): (
        "5916b6b8c26da96667dcbeb14f761f56",
        "f9ebdf0634e018e4683b2f350556a163",
        "1ba308a4e7cac14f40731cda360d60bb",
    ),
    ("toleration-seconds-without-noexecute", "builtin-fw"): (
        "4167d591adc39dac063232e58edb1b77",
        "04971ef2133243b7f17e87e2269f2524",
        "77f6422b4f68fa2e772aa3f8d67a1af7",
    ),
    ("toleration-seconds-without-noexecute", "default"): (
        "9aadfb57457b5859d53fedf0be786ea5",
        "e20a0af066d94ffc6c96a1f790520dee",
        "1163d18cb2889a8abc6edc459ea909e1",
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
