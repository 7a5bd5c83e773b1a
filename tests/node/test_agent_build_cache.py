"""Building on the node: per-kernel, per-version cache; build first, then swap."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kmodkit.agent.build_cache import BuildFailed
from kmodkit.agent.config import AgentConfig
from kmodkit.agent.errors import AgentError
from tests.node.harness import DEP, DEVICE, TOP, Node

REPO = Path(__file__).resolve().parents[2]

# Stands in for "clone tt-kmd at the tag and make modules": a real process that
# writes (simulated) .ko files into $KMODKIT_OUTPUT_DIR, or fails like a build.
BUILD_SCRIPT = f"""
import os, sys
from pathlib import Path
sys.path.insert(0, {str(REPO)!r})
from tests.node.simulated_kernel import write_module

log, mode = Path(sys.argv[1]), sys.argv[2]
kernel, version = os.environ["KMODKIT_KERNEL_VERSION"], os.environ["KMODKIT_VERSION"]
with log.open("a") as builds:
    builds.write(f"{{kernel}} {{version}} {{os.environ['KMODKIT_KERNEL_BUILD_DIR']}}\\n")
print("make -C $KMODKIT_KERNEL_BUILD_DIR M=$PWD modules")
if mode == "fail":
    print("tenstorrent.c:42:5: error: implicit declaration of 'pci_foo'", file=sys.stderr)
    sys.exit(2)
if mode == "no-output":
    sys.exit(0)
out = Path(os.environ["KMODKIT_OUTPUT_DIR"])
firmware = ["tenstorrent/never-shipped.bin"] if mode == "init-fails" else []
write_module(out / "{DEP}.ko", "{DEP}", version=version)
write_module(out / "{TOP}.ko", "{TOP}", version=version, depends=["{DEP}"],
             devices=["{DEVICE}"], firmware=firmware)
"""


def _build_config(node: Node, version: str, mode: str = "ok") -> AgentConfig:
    script = node.tmp / "build.py"
    script.write_text(BUILD_SCRIPT)
    return node.config(
        version=version,
        build={
            "command": [sys.executable, str(script), str(node.tmp / "builds.log"), mode],
            "cacheDir": "/var/cache/tt-kmd",
        },
    )


def _builds(node: Node) -> list[str]:
    log = node.tmp / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def headers(node: Node) -> Node:
    node.write_host(f"/lib/modules/{node.kernel.release}/build/Makefile", "# kbuild\n")
    return node


def _version(node: Node) -> str:
    return (node.root / "sys/module/tenstorrent/version").read_text().strip()


def test_cache_miss_builds_into_the_cache_then_loads_from_it(headers: Node) -> None:
    node = headers
    node.agent(_build_config(node, "2.9.0")).load()

    release = node.kernel.release
    cache = node.root / "var/cache/tt-kmd" / release / "2.9.0"
    assert sorted(p.name for p in cache.iterdir()) == ["tenstorrent.ko", "tt_helper.ko"]
    assert _builds(node) == [f"{release} 2.9.0 {node.root}/lib/modules/{release}/build"]
    assert [c[1] for c in node.kmod_calls("insmod")] == [
        str(cache / "tt_helper.ko"),
        str(cache / "tenstorrent.ko"),
    ]
    assert node.loaded() == [DEP, TOP]
    assert node.events("build.done")[0]["output_tail"] == [
        "make -C $KMODKIT_KERNEL_BUILD_DIR M=$PWD modules"
    ]
    assert not list(cache.parent.glob(".build-*"))


def test_cache_hit_loads_without_building(headers: Node) -> None:
    node = headers
    node.agent(_build_config(node, "2.9.0")).load()
    node.kernel = node.kernel.reboot()

    node.agent(_build_config(node, "2.9.0", mode="fail")).load()

    assert len(_builds(node)) == 1
    assert node.events("build.cache_hit")
    assert node.loaded() == [DEP, TOP]


def test_each_kernel_has_its_own_cache(headers: Node) -> None:
    node = headers
    node.agent(_build_config(node, "2.9.0")).load()
    node.kernel = node.kernel.reboot()
    node.kernel = type(node.kernel)(node.root, release="6.1.0-newer-amd64")
    node.write_host("/lib/modules/6.1.0-newer-amd64/build/Makefile")

    node.agent(_build_config(node, "2.9.0")).load()

    assert [line.split()[0] for line in _builds(node)] == ["6.1.0-sim-amd64", "6.1.0-newer-amd64"]
    assert (node.root / "var/cache/tt-kmd/6.1.0-newer-amd64/2.9.0/tenstorrent.ko").is_file()


def test_a_failed_build_leaves_the_loaded_driver_in_place(headers: Node) -> None:
    node = headers
    node.agent(_build_config(node, "2.8.0")).load()
    node.kernel.calls.clear()

    with pytest.raises(BuildFailed) as failed:
        node.agent(_build_config(node, "2.9.0", mode="fail")).load()

    assert node.kmod_calls("rmmod") == []
    assert node.loaded() == [DEP, TOP]
    assert _version(node) == "2.8.0"
    assert "implicit declaration" in " ".join(failed.value.fields["output_tail"])
    kernel_dir = node.root / "var/cache/tt-kmd" / node.kernel.release
    assert sorted(p.name for p in kernel_dir.iterdir()) == ["2.8.0"]


def test_a_build_that_produces_no_module_fails_and_keeps_the_driver(headers: Node) -> None:
    node = headers
    node.agent(_build_config(node, "2.8.0")).load()

    with pytest.raises(BuildFailed, match=r"did not produce tt_helper\.ko, tenstorrent\.ko"):
        node.agent(_build_config(node, "2.9.0", mode="no-output")).load()

    assert _version(node) == "2.8.0"


def test_missing_kernel_headers_fail_before_anything_is_touched(node: Node) -> None:
    node.preload_pair("2.8.0")
    node.kernel.calls.clear()

    with pytest.raises(BuildFailed, match=r"install linux-headers-6\.1\.0-sim-amd64"):
        node.agent(_build_config(node, "2.9.0")).load()

    assert node.kernel.calls == []
    assert _builds(node) == []


def test_a_new_build_that_fails_to_load_is_rolled_back(headers: Node) -> None:
    node = headers
    node.agent(_build_config(node, "2.8.0")).load()

    with pytest.raises(AgentError) as failed:
        node.agent(_build_config(node, "2.9.0", mode="init-fails")).load()

    assert failed.value.fields["rolled_back_to"] == "2.8.0"
    assert _version(node) == "2.8.0"
    assert node.loaded() == [DEP, TOP]
    assert node.events("rollback.done")[0]["version"] == "2.8.0"


def test_leftovers_of_an_interrupted_build_are_swept(headers: Node) -> None:
    node = headers
    leftover = node.root / "var/cache/tt-kmd" / node.kernel.release / ".build-2.9.0-abc"
    leftover.mkdir(parents=True)
    (leftover / "tenstorrent.ko").write_text("half")

    node.agent(_build_config(node, "2.9.0")).load()

    assert not leftover.exists()
    assert node.loaded() == [DEP, TOP]


def test_build_needs_a_version_to_key_the_cache(node: Node) -> None:
    with pytest.raises(AgentError, match="build needs version"):
        node.config(version=None, build={"command": ["true"], "cacheDir": "/var/cache/x"})
