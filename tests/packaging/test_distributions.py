"""The three distributions this repository builds, built for real as wheels and read back.

The product (`pip install .`) installs the one import root ``kmodkit``; the node
agent's own distribution (``agent/``) holds ``kmodkit.agent`` alone and needs
only what it imports; the dev harness (``devcluster/``) is a distribution of its
own that the product never contains.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the three pyproject.toml files build from; copied, since setuptools
# leaves build/ and *.egg-info/ beside the sources it builds.
SOURCES = ("pyproject.toml", "README.md", "kmodkit", "agent", "devcluster")


def _wheel(source: Path, out: Path) -> zipfile.ZipFile:
    # No build isolation: the venv's setuptools builds it, so no index is asked.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _top_level(wheel: zipfile.ZipFile) -> set[str]:
    return {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" not in n}


def _requires(wheel: zipfile.ZipFile) -> set[str]:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    parsed = Parser().parsestr(wheel.read(meta).decode())
    return {
        r.split(">")[0].split("=")[0].split("<")[0].strip()
        for r in parsed.get_all("Requires-Dist") or []
        if "extra ==" not in r
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    junk = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=junk)
        else:
            shutil.copy(source, root / name)
    return root


@pytest.fixture(scope="module")
def product(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return _wheel(tree, tmp_path_factory.mktemp("product"))


def test_the_product_installs_one_import_root(product: zipfile.ZipFile) -> None:
    assert _top_level(product) == {"kmodkit"}
    names = product.namelist()
    assert "kmodkit/sdk.py" in names
    assert not [n for n in names if "kmodkit_dev" in n or n.endswith(("go.mod", "go.sum"))]


def test_the_product_declares_its_backends_and_commands(product: zipfile.ZipFile) -> None:
    (eps,) = [n for n in product.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = product.read(eps).decode()
    assert "intel_xe = kmodkit.backends.intel_xe:backend" in text
    assert "tenstorrent = kmodkit.backends.tenstorrent:backend" in text
    assert "kmodkit = kmodkit.core.cli.main:main" in text
    assert "kmodkit-sign = kmodkit.core.signer.cli:main" in text  # what the signing Job runs


def test_the_agent_distribution_holds_the_agent_alone(tree: Path, tmp_path: Path) -> None:
    wheel = _wheel(tree / "agent", tmp_path)
    code = {n for n in wheel.namelist() if ".dist-info/" not in n}
    assert code and all(n.startswith("kmodkit/agent/") for n in code), sorted(code)
    assert "kmodkit/__init__.py" not in code  # a namespace portion, not a second kmodkit
    assert _requires(wheel) == {"pydantic", "PyYAML", "click"}


def test_the_dev_harness_is_its_own_distribution(tree: Path, tmp_path: Path) -> None:
    wheel = _wheel(tree / "devcluster", tmp_path)
    assert _top_level(wheel) == {"kmodkit_dev"}
    names = wheel.namelist()
    # The Go wrapper modules and kwok's stages travel with the harness that builds them.
    assert "kmodkit_dev/gomod/kubernetes/go.mod" in names
    assert "kmodkit_dev/kwok/stages.yaml" in names
