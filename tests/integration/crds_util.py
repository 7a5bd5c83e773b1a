"""The generated manifests in crds/, installed for tests (see kmodkit_dev.manifests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kmodkit_dev import manifests as devmanifests

CRDS_DIR = Path(__file__).resolve().parents[2] / "crds"


def manifests() -> list[dict[str, Any]]:
    """Every document in crds/."""
    return [
        doc
        for path in sorted(CRDS_DIR.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]


def install(api: client.ApiClient) -> None:
    """Install everything in crds/ and wait until the CRDs are served."""
    devmanifests.install(api, manifests())
