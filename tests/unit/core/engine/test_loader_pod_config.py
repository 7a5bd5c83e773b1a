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
        "8f1030319bb0242d35b8c658e90f6ca8",
        "3a562135cb222b29ee8e7369f33e0171",
        "3b0d2e938fed6c367f4b4231aa0030a3",
    ),
    ("container-image-port-no-tag", "default"): (
        "0c1158a4d262477e525462160bc701b5",
        "7fd1b40f1b3c6b685fead2849a207d70",
        "5e1667812019d2ac70258113a34b2b25",
    ),
    ("kmm", "builtin-fw"): (
        "cf9c51753f04b90cd49937b4db54eb76",
        "f995067ff845b75d18a2e8f626d22100",
        "78385158a15de0948c92206cc0d1085a",
    ),
    ("kmm", "default"): (
        "564966f3c6bbd33f748114e006376431",
        "4f100e83d3a3ec3de3ed2e6aa9877e75",
        "4160f1ade0ceb347e12d705a2e82e7ba",
    ),
    ("kmodkit", "builtin-fw"): (
        "cf9c51753f04b90cd49937b4db54eb76",
        "f995067ff845b75d18a2e8f626d22100",
        "78385158a15de0948c92206cc0d1085a",
    ),
    ("kmodkit", "default"): (
        "564966f3c6bbd33f748114e006376431",
        "4f100e83d3a3ec3de3ed2e6aa9877e75",
        "4160f1ade0ceb347e12d705a2e82e7ba",
    ),
    ("max-unavailable-over-100-percent", "builtin-fw"): (
        "8f1030319bb0242d35b8c658e90f6ca8",
        "3a562135cb222b29ee8e7369f33e0171",
        "3b0d2e938fed6c367f4b4231aa0030a3",
    ),
    ("max-unavailable-over-100-percent", "default"): (
        "0c1158a4d262477e525462160bc701b5",
        "7fd1b40f1b3c6b685fead2849a207d70",
        "5e1667812019d2ac70258113a34b2b25",
    ),
    ("max-unavailable-zero", "builtin-fw"): (
        "8f1030319bb0242d35b8c658e90f6ca8",
        "3a562135cb222b29ee8e7369f33e0171",
        "3b0d2e938fed6c367f4b4231aa0030a3",
    ),
    ("max-unavailable-zero", "default"): (
        "0c1158a4d262477e525462160bc701b5",
        "7fd1b40f1b3c6b685fead2849a207d70",
        "5e1667812019d2ac70258113a34b2b25",
    ),
    ("minimal-full", "builtin-fw"): (
        "ba84fe150227bc0061c5d6a023037b48",
        "d445b3631a5b8a2b38addc6c9cda229f",
        "4b1b8eed1f5f0936e4b5f9ea425fbd32",
    ),
    ("minimal-full", "default"): (
        "c9cc862f0b144778e795e19b084b8856",
        "42d0177c37b3ad08d8eff83a5c543187",
        "2b75015c5c19817e97d9e75cace459c0",
    ),
    ("minimal", "builtin-fw"): (
        "8f1030319bb0242d35b8c658e90f6ca8",
        "3a562135cb222b29ee8e7369f33e0171",
        "3b0d2e938fed6c367f4b4231aa0030a3",
    ),
    ("minimal", "default"): (
        "0c1158a4d262477e525462160bc701b5",
        "7fd1b40f1b3c6b685fead2849a207d70",
        "5e1667812019d2ac70258113a34b2b25",
    ),
    ("name-and-namespace-too-long", "builtin-fw"): (
        "8f1030319bb0242d35b8c658e90f6ca8",
        "3a562135cb222b29ee8e7369f33e0171",
        "3b0d2e938fed6c367f4b4231aa0030a3",
    ),
    ("name-and-namespace-too-long", "default"): (
        "0c1158a4d262477e525462160bc701b5",
        "7fd1b40f1b3c6b685fead2849a207d70",
        "5e1667812019d2ac70258113a34b2b25",
    ),
    ("name-not-dns", "builtin-fw"): (
        "8f1030319bb0242d35b8c658e90f6ca8",
        "3a562135cb222b29ee8e7369f33e0171",
        "3b0d2e938fed6c367f4b4231aa0030a3",
    ),
    ("name-not-dns", "default"): (
        "0c1158a4d262477e525462160bc701b5",
        "7fd1b40f1b3c6b685fead2849a207d70",
        "5e1667812019d2ac70258113a34b2b25",
    ),
    ("toleration-bad-key", "builtin-fw"): (
        "adad9b76d32c00379a848ef9231376e1",
        "c32164eed3ff2e9f5e9c9aceb6f4e515",
        "78bcffade773d641f81b79afe9fbe7c3",
    ),
    ("toleration-bad-key", "default"): (
        "5a1ecf4f0e4db783a43d9c4ccb0716b1",
        "be298249db23844d40acd396b9ccf89c",
        "134d7ccd6b06e2d2bb5a9130d659734c",
    ),
    ("toleration-bad-value", "builtin-fw"): (
        "9d342a6f032867cd461dcd372cd200fd",
        "ab68f98d42523c0a29f5a2f5daee9db7",
        "cdfa72ce26ea0baaa5a46106950d9be8",
    ),
    ("toleration-bad-value", "default"): (
        "4f5a44bcd13d0a33ba8ff7e83d1ccaa2",
        "809d44606dc0b32008c16441c060f53f",
        "ca08d8f4e6e0c28cdcba9f9eea6b5dbd",
    ),
    ("toleration-empty-key-equal", "builtin-fw"): (
        "c41d3c4d3c6a9cde5dab355480dda93c",
        "81dd6116b78975acd73eda76f7ab105e",
        "ac621a1e58edfa9a80e06a36cff91469",
    ),
    ("toleration-empty-key-equal", "default"): (
        "1a79d5ed04fbfa093d28a30b4635280d",
        "052947dfcc5908700d145548b5aa3c03",
        "8d2cc8a1f670933810f4ca0047274672",
    ),
    ("toleration-exists-with-value", "builtin-fw"): (
        "c720ef1ee716574a864970dac90241fd",
        "5a7778ab78d2b060b85dba209106bd8f",
        "5558ca830f68dfe43ef58bff0487f022",
    ),
    ("toleration-exists-with-value", "default"): (
        "5a910932603fb7e501ea2261aa639919",
        "520d00ab3b426e263fdbe0047ff40c07",
        "bc9aca0564df3e7e124dccd2540cda61",
    ),
    ("toleration-seconds-without-noexecute", "builtin-fw"): (
        "78f5e7ef3d8ab06728c8d673485c7a81",
        "497f654bf6adfd2d139badf0c6fc2982",
        "555d9e27dc6e61d4f5dc9b869b4d6c54",
    ),
    ("toleration-seconds-without-noexecute", "default"): (
        "8182fe8241e609c02ae98891886c024a",
        "4d0dc6cda5c2c71d6e94aed93a4d5816",
        "0fa22e8834cc2ae5247038c170eafd03",
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
