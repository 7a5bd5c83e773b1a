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
    loader_pod_view,
    unload_pod,
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
        "4e4d0f3cd1e4aa4e9f0d959b564de536",
        "4859c045cdd2cdd5fc95aab8ddd7f2ee",
        "c5f724259b62c8f1ed437a720d40ad95",
    ),
    ("container-image-port-no-tag", "default"): (
        "8f0ed4533b545ddc65c87fed61aa5278",
        "59207b634f54b8d79073a14e2fee6504",
        "2dfc37539c88fe6712f02025890f5d0c",
    ),
    ("device-plugin-host-path-outside", "builtin-fw"): (
        "4e4d0f3cd1e4aa4e9f0d959b564de536",
        "4859c045cdd2cdd5fc95aab8ddd7f2ee",
        "c5f724259b62c8f1ed437a720d40ad95",
    ),
    ("device-plugin-host-path-outside", "default"): (
        "8f0ed4533b545ddc65c87fed61aa5278",
        "59207b634f54b8d79073a14e2fee6504",
        "2dfc37539c88fe6712f02025890f5d0c",
    ),
    ("in-tree-single-and-list", "builtin-fw"): (
        "950aefe066988ba3aaffd7aadc216653",
        "e46d42cbcba3a609105a961de80b37d8",
        "14557dbc81f6327a778e3be4a9583a91",
    ),
    ("in-tree-single-and-list", "default"): (
        "1cabb1cbea49701b45cefd70d48a93c8",
        "c05322b868a22c44897558cdf1dbd796",
        "cae1d8e93bc2ac9f0ea82fc76f2b7580",
    ),
    ("kmm", "builtin-fw"): (
        "858afef4742fa25939ad5031b1f28883",
        "cebb47a5cc911f484a861aa3277707c7",
        "33a16730479f14bba6dff44a7d1c1547",
    ),
    ("kmm", "default"): (
        "02f7e6e213cf0832786c4dad4adafdac",
        "94ea4f140d1358722fe60074ddff2e09",
        "31cc4df63eb30d9c69b2fab55bfe8afd",
    ),
    ("kmodkit", "builtin-fw"): (
        "858afef4742fa25939ad5031b1f28883",
        "cebb47a5cc911f484a861aa3277707c7",
        "33a16730479f14bba6dff44a7d1c1547",
    ),
    ("kmodkit", "default"): (
        "02f7e6e213cf0832786c4dad4adafdac",
        "94ea4f140d1358722fe60074ddff2e09",
        "31cc4df63eb30d9c69b2fab55bfe8afd",
    ),
    ("max-unavailable-over-100-percent", "builtin-fw"): (
        "4e4d0f3cd1e4aa4e9f0d959b564de536",
        "4859c045cdd2cdd5fc95aab8ddd7f2ee",
        "c5f724259b62c8f1ed437a720d40ad95",
    ),
    ("max-unavailable-over-100-percent", "default"): (
        "8f0ed4533b545ddc65c87fed61aa5278",
        "59207b634f54b8d79073a14e2fee6504",
        "2dfc37539c88fe6712f02025890f5d0c",
    ),
    ("max-unavailable-zero", "builtin-fw"): (
        "4e4d0f3cd1e4aa4e9f0d959b564de536",
        "4859c045cdd2cdd5fc95aab8ddd7f2ee",
        "c5f724259b62c8f1ed437a720d40ad95",
    ),
    ("max-unavailable-zero", "default"): (
        "8f0ed4533b545ddc65c87fed61aa5278",
        "59207b634f54b8d79073a14e2fee6504",
        "2dfc37539c88fe6712f02025890f5d0c",
    ),
    ("minimal", "builtin-fw"): (
        "4e4d0f3cd1e4aa4e9f0d959b564de536",
        "4859c045cdd2cdd5fc95aab8ddd7f2ee",
        "c5f724259b62c8f1ed437a720d40ad95",
    ),
    ("minimal", "default"): (
        "8f0ed4533b545ddc65c87fed61aa5278",
        "59207b634f54b8d79073a14e2fee6504",
        "2dfc37539c88fe6712f02025890f5d0c",
    ),
    ("minimal-full", "builtin-fw"): (
        "227062344698a90225e8e3d2b6672c96",
        "c49dd46e37d0e8d9728abd0a18e180e5",
        "d21408c7df45e468ead55ac8bedbb6b2",
    ),
    ("minimal-full", "default"): (
        "12bd06a5016a4677595d31fe06115152",
        "6a85e084953e91bb0ed7851dbb77d0e0",
        "b71863098b084f10a10fe1293048ae0c",
    ),
    ("name-and-namespace-too-long", "builtin-fw"): (
        "efc16df321037f34f0b3703e37c52ebc",
        "1db83baed4c4289d8a694963fb479daa",
        "6c684cae9fe37fab7fd3fbb7190075ff",
    ),
    ("name-and-namespace-too-long", "default"): (
        "f7685324701291dd3d8d1fcd75a7d1b6",
        "b4395cac13fbda63970fc71e7b802438",
        "f4012ab5fe6aa4a0315cc0a2b0b85dd7",
    ),
    ("name-not-dns", "builtin-fw"): (
        "8d3badd0626c27590931f2a342b92f10",
        "ca95dfa92f878d073a842bbf8024d259",
        "000190e1a5a91abb82e6b0b30c8289b0",
    ),
    ("name-not-dns", "default"): (
        "ef7016943745adaaffa9ec205cf4e299",
        "14e83f9a40b5d807d1aa39809040beb7",
        "e9f326751810855607ea13078cf2dde9",
    ),
    ("raw-args-with-module-name", "builtin-fw"): (
        "137516a7745b9dcbb95fc70e6f69f2d7",
        "098122269c0f79972dd496e1d90d6e2f",
        "4e051f02a252d0db81dd63de60d94d4c",
    ),
    ("raw-args-with-module-name", "default"): (
        "cddceff43a5f79cbca9511bba4153dd0",
        "4ce6b3db0e0d51d014722642661d1b3e",
        "26e34c46f072234176d756c1ee145289",
    ),
    ("toleration-bad-key", "builtin-fw"): (
        "6395bed2d14d46e2ad8d650438d1e55c",
        "8e67c7372e56e5c1d47fd7f82e36b470",
        "e9d611f2537b43c971df89fa8c11341c",
    ),
    ("toleration-bad-key", "default"): (
        "bdbf68241e1b1c39405a3d4672a04bb7",
        "09b86edd3b1dc9c56a6d3cba214cd8f7",
        "0a32cf6654d7c2e126a3b80cc57fb93c",
    ),
    ("toleration-bad-value", "builtin-fw"): (
        "7d885dbb42c3dbb2b214ad4bf58af87d",
        "44fa203a093676d1a174c81e52de3ef4",
        "e40ed1e6cdfe8c86ce8ea7eda4412b94",
    ),
    ("toleration-bad-value", "default"): (
        "9219bca49dee33e520a4bf8cb363da7b",
        "6633f38c28574b8cd5d166bf8f28c683",
        "506c0a5e51c4ef4ed3390a8dd0ed4759",
    ),
    ("toleration-empty-key-equal", "builtin-fw"): (
        "898deea05627036ccff0798329561eb5",
        "c8179b3a2ce6fb6bbbfdc5705337cb11",
        "74caaffb9afa4e21569cb9438a6bbd7a",
    ),
    ("toleration-empty-key-equal", "default"): (
        "cec29b222f9a18a8f1bc7f6dbe56d110",
        "85f3f2dd19318d12f8c5aa1ad03042bc",
        "365009d6de972d432badaff70fc32228",
    ),
    ("toleration-exists-with-value", "builtin-fw"): (
        "81e921918c712c89c7b66769cfec0933",
        "4282a8f97d43e85964940c87ea7c6434",
        "15ba72dc2011a69d869ed48007cb8af6",
    ),
    ("toleration-exists-with-value", "default"): (
        "7fffbb5770b333fb730b62e2dd70209e",
        "f0e15e576942a4b84def6585346a5bb9",
        "cd754198428f3bc50c6661d776b5d539",
    ),
    ("toleration-seconds-without-noexecute", "builtin-fw"): (
        "7141e357ea08dc9a5582d10b58825b3e",
        "224273af005045f55f418aae869e8c6d",
        "c307a54b9d4fcbeccda107c366652c4b",
    ),
    ("toleration-seconds-without-noexecute", "default"): (
        "2c9f79449be42a014d9a2dec59e37581",
        "a008d1c00fb8a27d809db4b35d4259f3",
        "289b6f624565d702752c5db8bbb707e7",
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


def _agent_capabilities(pod: Mapping[str, Any]) -> list[str]:
    agent = next(c for c in pod["spec"]["containers"] if c["name"] == "agent")
    return list(agent["securityContext"]["capabilities"]["add"])


def test_device_paths_reach_the_agent_and_let_loader_and_unloader_read_holders() -> None:
    module = Module.model_validate(minimal(devicePaths=["/dev/xe*", "/dev/dri/render*"]))
    settings = SETTINGS["builtin-fw"]
    (pod, *_) = first_load(module, settings, []).create
    assert parsed_config(pod).device_paths == ["/dev/xe*", "/dev/dri/render*"]
    assert _agent_capabilities(pod) == ["SYS_MODULE", "SYS_PTRACE"]
    unloader = unload_pod(module, loader_pod_view(pod), settings, after="uid-1")
    assert _agent_capabilities(unloader) == ["SYS_MODULE", "SYS_PTRACE"]
    # Without them: SYS_MODULE alone, and a configuration (and hash) as before.
    plain = Module.model_validate(minimal())
    (before, *_) = first_load(plain, settings, []).create
    assert "devicePaths" not in agent_yaml(before)
    assert _agent_capabilities(before) == ["SYS_MODULE"]
    assert _agent_capabilities(unload_pod(plain, loader_pod_view(before), settings, "u")) == [
        "SYS_MODULE"
    ]


@pytest.mark.parametrize("path", ["dev/xe0", "/sys/class/drm", "/dev/xe 0", "/dev/"])
def test_a_device_path_outside_dev_is_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="devicePaths"):
        Module.model_validate(minimal(devicePaths=[path]))
