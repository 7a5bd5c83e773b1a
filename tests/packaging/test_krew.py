"""The krew manifest of ``kubectl kmodkit`` and the archive it names, checked by krew itself.

The archive is built afresh (``krew/archive.py``, reproducible byte for byte), so
the manifest's sha256 must be that of what this tree builds; krew's own validator
reads the manifest, and krew installs the archive into a scratch ``KREW_ROOT``,
where the installed ``kubectl-kmodkit`` must run the plugin, or say what is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from kmodkit_dev import build

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "krew" / "kmodkit.yaml"
SEMVER = re.compile(r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
VERBS = ("status", "pause", "resume", "skip", "unskip", "retry", "upgrade")


def _archive_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("krew_archive", REPO / "krew" / "archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return dict(yaml.safe_load(MANIFEST.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = _archive_module().build(tmp_path_factory.mktemp("krew"))
    return path


def test_the_manifest_names_this_version_and_this_archive(
    manifest: dict[str, Any], archive: Path
) -> None:
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == MANIFEST.stem == "kmodkit"
    spec = manifest["spec"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert SEMVER.match(spec["version"]) and spec["version"] == f"v{project['version']}"
    chart = yaml.safe_load((REPO / "charts" / "kmodkit" / "Chart.yaml").read_text("utf-8"))
    assert spec["homepage"] == chart["home"]
    assert spec["shortDescription"] and spec["description"] and spec["caveats"]
    digest = _archive_module().sha256(archive)
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert spec["platforms"]
    for platform in spec["platforms"]:
        assert platform["selector"]
        assert platform["uri"].endswith(f"/{spec['version']}/{archive.name}")
        assert platform["sha256"] == digest, "the archive changed: put its sha256 in the manifest"
        assert {f["from"] for f in platform["files"]} <= set(members)
        bin_member = members[platform["bin"]]
        assert bin_member.isfile() and bin_member.mode & 0o111


def test_the_archive_is_reproducible(archive: Path, tmp_path: Path) -> None:
    again = _archive_module().build(tmp_path)
    assert again.read_bytes() == archive.read_bytes()


@pytest.mark.timeout(600)  # the first use builds krew from the Go module proxy
def test_krew_validates_and_installs_it(archive: Path, tmp_path: Path) -> None:
    build.ensure(["krew"])
    check = subprocess.run(
        [str(build.binary("validate-krew-manifest")), "-manifest", str(MANIFEST), "-skip-install"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    root = tmp_path / "krew-root"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run(
        [str(build.binary("krew")), "install", f"--manifest={MANIFEST}", f"--archive={archive}"],
        env={**env, "KREW_ROOT": str(root)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr
    plugin = root / "bin" / "kubectl-kmodkit"

    def run(python: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(plugin), "--help"],
            env={**env, "KMODKIT_PYTHON": python, **extra},
            capture_output=True,
            text=True,
        )

    works = run(sys.executable, PYTHONPATH=str(REPO))
    assert works.returncode == 0, works.stderr
    assert works.stdout.startswith("Usage: kubectl kmodkit ")
    assert all(re.search(rf"^  {verb} ", works.stdout, re.M) for verb in VERBS), works.stdout
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    missing = run(str(bare / "bin" / "python"))
    assert missing.returncode == 1
    assert "needs the kmodkit Python package" in missing.stderr
    assert "pip install kmodkit" in missing.stderr
