"""A node in a temp dir: a host root with a simulated kernel, and a driver image."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kmodkit.agent.actions import HostAccess, NodeAgent
from kmodkit.agent.config import AgentConfig, parse_config
from kmodkit.agent.hostroot import HostRoot
from kmodkit.agent.jsonlog import EventLog
from tests.node.simulated_kernel import SimulatedKernel, write_module

REPO = Path(__file__).resolve().parents[2]
TOP = "tenstorrent"
DEP = "tt_helper"
DEVICE = "/dev/tenstorrent/0"


@dataclass
class Node:
    tmp: Path
    kernel: SimulatedKernel
    output: io.StringIO = field(default_factory=io.StringIO)

    @property
    def root(self) -> Path:
        return self.kernel.host

    @property
    def host(self) -> HostRoot:
        return HostRoot(self.root)

    @property
    def image(self) -> Path:
        """The driver image's module prefix (KMM's dirName)."""
        return self.tmp / "image" / "opt"

    @property
    def image_firmware(self) -> Path:
        return self.tmp / "image" / "firmware"

    def image_module(self, name: str, **facts: Any) -> Path:
        release = self.kernel.release
        return write_module(
            self.image / "lib" / "modules" / release / "extra" / f"{name}.ko", name, **facts
        )

    def image_pair(self, version: str = "2.9.0", **top_facts: Any) -> None:
        """The usual driver: TOP (exposing DEVICE) linking against DEP."""
        self.image_module(DEP, version=version)
        self.image_module(TOP, version=version, depends=[DEP], devices=[DEVICE], **top_facts)
        self.kernel(["depmod", "-b", str(self.image), self.kernel.release])

    def preload(
        self,
        name: str,
        *,
        version: str | None = None,
        depends: Sequence[str] = (),
        devices: Sequence[str] = (),
        in_tree: bool = False,
        srcversion: str | None = None,
    ) -> None:
        """Load a module as if it were there before the agent started."""
        path = write_module(
            self.tmp / "preloaded" / f"{name}-{version}.ko",
            name,
            version=version,
            depends=depends,
            devices=devices,
            in_tree=in_tree,
            srcversion=srcversion,
        )
        result = self.kernel(["insmod", str(path)])
        assert result.returncode == 0, result.stderr

    def preload_pair(self, version: str) -> None:
        self.preload(DEP, version=version)
        self.preload(TOP, version=version, depends=[DEP], devices=[DEVICE])

    def config(self, **overrides: Any) -> AgentConfig:
        document: dict[str, Any] = {
            "modprobe": {
                "moduleName": TOP,
                "dirName": str(self.image),
                "modulesLoadingOrder": [TOP, DEP],
            },
            "version": "2.9.0",
            "devicePaths": ["/dev/tenstorrent/*"],
            "unloadTimeoutSeconds": 0.3,
        }
        document.update(overrides)
        return parse_config(document, source="test")

    def config_file(self, **overrides: Any) -> Path:
        path = self.tmp / "agent.yaml"
        path.write_text(yaml.safe_dump(self.config(**overrides).model_dump(by_alias=True)))
        return path

    def access(self) -> HostAccess:
        return HostAccess(
            kmod_runner=self.kernel,
            kill=self.kernel.kill,
            poll_interval=0.01,
            pause_poll_interval=0.01,
            lock_timeout=0.2,
            kernel_log=self.kernel.kernel_log,
        )

    def agent(self, config: AgentConfig | None = None) -> NodeAgent:
        log = EventLog("test", self.output)
        return NodeAgent(config or self.config(), self.host, log, self.access())

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        records = [json.loads(line) for line in self.output.getvalue().splitlines()]
        return [r for r in records if name is None or r["event"] == name]

    def loaded(self) -> list[str]:
        return list(self.kernel.modules)

    def kernel_changes(self) -> list[tuple[str, ...]]:
        """The kmod calls that change what is loaded (modinfo and depmod only read)."""
        return [c for c in self.kernel.calls if c[0] in ("insmod", "rmmod", "modprobe")]

    def kmod_calls(self, tool: str) -> list[tuple[str, ...]]:
        return [c for c in self.kernel.calls if c[0] == tool]

    def run_agent(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """The real ``kmodkit-agent run`` process on this node, built on the node (so
        no image to read with modinfo: no kmod tools needed), its JSON lines on stdout."""
        config_file = self.config_file(build={"command": ["false"], "cacheDir": "/var/cache/tt"})
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from kmodkit.agent.cli import main; main()",
                "--host-root",
                str(self.root),
                "--config",
                str(config_file),
                "run",
                *args,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def write_host(self, host_path: str, text: str = "") -> Path:
        target = self.root / host_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target
