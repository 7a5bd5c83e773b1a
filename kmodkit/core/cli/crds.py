"""Every manifest `kmodkit crds` writes: the Module CRD and those of every installed backend.

Here, above plugin discovery, rather than beside the generator: the generator
knows models, not which backends are installed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kmodkit.core.runtime.plugins import discover
from kmodkit.core.schema.crd import HEADER, MODULE_CRD, crd_manifest, module_name_policy, to_yaml


def _sources(enabled: Iterable[str] | None) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(file name, owning backend or "" for the core, documents) of every manifest."""
    module = f"{MODULE_CRD.group}_{MODULE_CRD.plural}"
    found = [
        ("", f"{module}.yaml", [crd_manifest(MODULE_CRD)]),
        ("", f"{module}_admission-policy.yaml", module_name_policy()),
    ]
    for backend in discover(enabled):
        if backend.backend is None:
            continue
        for resource in backend.backend.resources:
            crd = resource.crd
            extra = resource.extra_documents() if resource.extra_documents else []
            found.append(
                (backend.name, f"{crd.group}_{crd.plural}.yaml", [crd_manifest(crd), *extra])
            )
    return [(name, owner, docs) for owner, name, docs in found]


def generated_documents(enabled: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every generated manifest, by the file name it is written to.

    The core Module first, then the resources of every installed backend
    (``enabled`` limits which), each with the extra manifests it declares.
    """
    return {name: docs for name, _, docs in _sources(enabled)}


def generated_files(enabled: Iterable[str] | None = None) -> dict[str, str]:
    """Every generated file's text, by file name (``enabled`` limits the backends)."""
    return {name: HEADER + to_yaml(docs) for name, docs in generated_documents(enabled).items()}


ADMISSION_TEMPLATE = "templates/admission-policies.yaml"


def chart_files(enabled: Iterable[str] | None = None) -> dict[str, str]:
    """The chart's generated files, by path in the chart.

    ``crds/`` holds CustomResourceDefinitions only (Helm 4 accepts nothing else
    there, and Helm never upgrades it); the admission policies and bindings are
    a template, so they install, upgrade and uninstall with the release, each
    backend's only while the backend is enabled.
    """
    files: dict[str, str] = {}
    policies = []
    for name, owner, docs in _sources(enabled):
        crd_docs = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        if crd_docs:
            files[f"crds/{name}"] = HEADER + to_yaml(crd_docs)
        others = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
        if others:
            text = to_yaml(others)
            if "{{" in text:
                raise ValueError(f"{name}: a manifest contains '{{{{', which Helm would template")
            policies.append(
                f"{{{{- if .Values.backends.{owner}.enabled }}}}\n---\n{text}{{{{- end }}}}\n"
                if owner
                else f"---\n{text}"
            )
    files[ADMISSION_TEMPLATE] = HEADER + "".join(policies)
    return files


def write_files(out_dir: Path, files: Mapping[str, str]) -> list[Path]:
    """Write ``files`` (paths relative to ``out_dir``); returns the paths written."""
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
