"""The real helm, for the chart's tests (test_chart.py, test_alerts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.helm import HELMS, Helm


@pytest.fixture
def helm(tmp_path: Path) -> Helm:
    return Helm(tmp_path)


@pytest.fixture(params=HELMS)
def each_helm(request: pytest.FixtureRequest, tmp_path: Path) -> Helm:
    return Helm(tmp_path, tool=request.param)
