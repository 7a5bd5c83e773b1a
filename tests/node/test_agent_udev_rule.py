"""Host files (the udev rule) are in place before the driver's first load.

udev applies a rule to the device nodes it creates; a rule that arrives after
``insmod`` leaves the nodes of that first load with the kernel's default mode
(root only) until the next reboot or ``udevadm trigger``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kmodkit.agent.actions import NodeAgent
from kmodkit.agent.jsonlog import EventLog
from kmodkit.agent.kmod import CommandResult
from tests.node.harness import Node

RULE = "/etc/udev/rules.d/50-tenstorrent.rules"


def test_the_udev_rule_is_installed_before_the_first_load(node: Node, tmp_path: Path) -> None:
    node.image_pair()
    rule_source = tmp_path / "50-tenstorrent.rules"
    rule_source.write_text('KERNEL=="tenstorrent*", MODE="0666"\n')
    config = node.config(hostFiles=[{"source": str(rule_source), "target": RULE, "mode": "0644"}])
    rule_at_load: list[bool] = []

    def kernel(
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        if Path(argv[0]).name in ("insmod", "modprobe") and "-r" not in argv:
            rule_at_load.append(node.host.path(RULE).is_file())
        return node.kernel(argv, env=env, cwd=cwd, timeout=timeout)

    access = replace(node.access(), kmod_runner=kernel)
    NodeAgent(config, node.host, EventLog("test", node.output), access).load()

    assert node.loaded() == ["tt_helper", "tenstorrent"]
    assert rule_at_load and all(rule_at_load), "the rule must be on the host before insmod"
