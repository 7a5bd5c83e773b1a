"""Fixtures for node-agent tests: a host root in a temp dir with a simulated kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.node.harness import Node
from tests.node.simulated_kernel import SimulatedKernel


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, SimulatedKernel(tmp_path / "host"))
