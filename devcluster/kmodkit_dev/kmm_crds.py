"""Upstream KMM's own CRDs, pinned by commit and sha256, for the checks of kmodkit's KMM Modules.

No KMM file is part of this repository (the Go module proxy refuses
``sigs.k8s.io/kernel-module-management``, and copying KMM's API in would let it
drift). The files are read from the directory ``KMODKIT_KMM_CRDS`` names, else
from ``../shared/kmm-crds/`` beside the checkout, else downloaded once from
KMM's repository at the pinned commit into the kmodkit cache. Whatever the
source, every file must match its pinned sha256, so every run checks against
the same API.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from kmodkit_dev import manifests as devmanifests
from kmodkit_dev.build import cache_root
from kmodkit_dev.repo import ROOT

COMMIT: Final = "de3f8c9d5eae9cc68c0dbfaa72ba2d9c103b6494"
"""The KMM commit Intel's gpu-base-operator pins; the sums below are of its config/crd/bases."""
SHA256: Final[Mapping[str, str]] = {
    "kmm.sigs.x-k8s.io_modulebuildsignconfigs.yaml": (
        "be65278bed09e4a0d6db69b70aebf12858e937735963d2ee35f477bb175ff62e"
    ),
    "kmm.sigs.x-k8s.io_moduleimagesconfigs.yaml": (
        "cc5378cbf364c6e4ac8c681237a2fbda4a494519519efa9da4827fb6ea71e9c6"
    ),
    "kmm.sigs.x-k8s.io_modules.yaml": (
        "fc2267e2e8430381523fb34b487dc1dbe21625c9978ab1582c18fc4b66b66862"
    ),
    "kmm.sigs.x-k8s.io_nodemodulesconfigs.yaml": (
        "eb1120a983ebb253f9f2b63d5c65a18bd8a86eeeb036565ff2f0359580bce78f"
    ),
    "kmm.sigs.x-k8s.io_preflightvalidations.yaml": (
        "eb0ac9e67edc7d11f741561a54690664f89d0c59546b31a996cb42f7be48f821"
    ),
}
ENV: Final = "KMODKIT_KMM_CRDS"
SHARED: Final = ROOT.parent / "shared" / "kmm-crds"
BASE_URL: Final = (
    "https://raw.githubusercontent.com/kubernetes-sigs/kernel-module-management/"
    f"{COMMIT}/config/crd/bases"
)
DOWNLOAD_TIMEOUT = 60.0
WHERE = (
    f"KMM's config/crd/bases at commit {COMMIT}: put them in {SHARED} or name their "
    f"directory in {ENV} (docs/development.md, 'KMM schema check')"
)


class KmmCrdError(RuntimeError):
    """A pinned CRD file is missing, cannot be downloaded, or is not the pinned one."""


def local_dir(env: Mapping[str, str], shared: Path) -> Path | None:
    """The directory to read the files from, or None when they must be downloaded."""
    given = env.get(ENV, "").strip()
    if given:
        return Path(given).expanduser()
    return shared if shared.is_dir() else None


def mismatch(name: str, data: bytes, origin: str, sums: Mapping[str, str]) -> str | None:
    """Why ``data`` is not the pinned ``name``, or None when it is."""
    actual = hashlib.sha256(data).hexdigest()
    if actual == sums[name]:
        return None
    return f"{name} from {origin} has sha256 {actual}, not the pinned {sums[name]}; use {WHERE}"


def _read_checked(path: Path, origin: str, sums: Mapping[str, str]) -> Path:
    if not path.is_file():
        raise KmmCrdError(f"{path.name} is missing from {origin}; use {WHERE}")
    if problem := mismatch(path.name, path.read_bytes(), origin, sums):
        raise KmmCrdError(problem)
    return path


def _download(
    name: str, base_url: str, cache: Path, sums: Mapping[str, str], timeout: float
) -> Path:
    target = cache / name
    if target.is_file() and mismatch(name, target.read_bytes(), str(cache), sums) is None:
        return target
    url = f"{base_url}/{name}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as err:
        raise KmmCrdError(f"cannot download {name} from {url} ({err}); or use {WHERE}") from err
    if problem := mismatch(name, data, url, sums):
        raise KmmCrdError(problem)
    cache.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed over, so an interrupted run never leaves a
    # partial file that a later run would have to re-check.
    part = target.with_name(f".{name}.part")
    part.write_bytes(data)
    part.replace(target)
    return target


def crd_files(
    env: Mapping[str, str] = os.environ,
    shared: Path = SHARED,
    cache: Path | None = None,
    base_url: str = BASE_URL,
    sums: Mapping[str, str] = SHA256,
    timeout: float = DOWNLOAD_TIMEOUT,
) -> list[Path]:
    """Every pinned CRD file, each checked against its sha256 (``KmmCrdError`` otherwise)."""
    names = sorted(sums)
    source = local_dir(env, shared)
    if source is not None:
        origin = f"{source} ({ENV})" if env.get(ENV, "").strip() else str(source)
        return [_read_checked(source / name, origin, sums) for name in names]
    directory = cache if cache is not None else cache_root() / "kmm-crds" / COMMIT
    return [_download(name, base_url, directory, sums, timeout) for name in names]


def manifests(paths: list[Path]) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in ``paths``."""
    return [
        doc for path in paths for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc
    ]


def install(api: Any) -> list[dict[str, Any]]:
    """Install KMM's CRDs and wait until they are served; returns them for ``uninstall``."""
    crds = manifests(crd_files())
    devmanifests.install(api, crds)
    return crds


def uninstall(api: Any, crds: list[dict[str, Any]]) -> None:
    """Delete KMM's CRDs (and with them every KMM object) and wait until they are gone."""
    devmanifests.uninstall_crds(api, crds)
