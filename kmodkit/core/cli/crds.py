"""Every manifest `kmodkit crds` writes: the Module CRD and those of every installed backend.

Here, above plugin discovery, rather than beside the generator: the generator
knows models, not which backends are installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kmodkit.core.runtime.plugins import discover
from kmodkit.core.schema.crd import HEADER, MODULE_CRD, crd_manifest, module_name_policy, to_yaml


def generated_documents(enabled: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every generated manifest, by the file name it is written to.

    The core Module first, then the resources of every installed backend
    (``enabled`` limits which), each with the extra manifests it declares.
    """
    docs = {
        f"{MODULE_CRD.group}_{MODULE_CRD.plural}.yaml": [crd_manifest(MODULE_CRD)],
        f"{MODULE_CRD.group}_{MODULE_CRD.plural}_admission-policy.yaml": module_name_policy(),
    }
    for found in discover(enabled):
        if found.backend is None:
            continue
        for resource in found.backend.resources:
            crd = resource.crd
            extra = resource.extra_documents() if resource.extra_documents else []
            docs[f"{crd.group}_{crd.plural}.yaml"] = [crd_manifest(crd), *extra]
    return docs


def generated_files(enabled: Iterable[str] | None = None) -> dict[str, str]:
    """Every generated file's text, by file name (``enabled`` limits the backends)."""
    return {name: HEADER + to_yaml(docs) for name, docs in generated_documents(enabled).items()}


def write_files(out_dir: Path, enabled: Iterable[str] | None = None) -> list[Path]:
    """Write every generated file into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in generated_files(enabled).items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
