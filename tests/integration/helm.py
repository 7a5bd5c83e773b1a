"""The real helm CLI and the chart, for the tests that render or install it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from kmodkit_dev import build
from kmodkit_dev.versions import KUBERNETES_VERSION

CHART = Path(__file__).resolve().parents[2] / "charts" / "kmodkit"


# The current Helm and the one many clusters still use: the chart must work with both.
HELMS = ("helm4", "helm")


class Helm:
    """The real helm binary (``tool``: helm4 or helm, i.e. Helm 3) with its own config,
    cache and data directories."""

    def __init__(self, home: Path, kubeconfig: str | None = None, tool: str = "helm") -> None:
        build.ensure([tool])
        self.major = 4 if tool == "helm4" else 3
        # Helm names its server-side-apply field manager after its own executable: run
        # it as "helm", as users do, whichever binary it is.
        (home / "bin").mkdir(parents=True, exist_ok=True)
        self.binary = str(home / "bin" / "helm")
        Path(self.binary).symlink_to(build.binary(tool))
        self.env = dict(
            os.environ,
            HELM_CONFIG_HOME=str(home / "cfg"),
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_DATA_HOME=str(home / "data"),
        )
        if kubeconfig:
            self.env["KUBECONFIG"] = kubeconfig

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        if ok:
            assert out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stderr}{out.stdout}"
        return out

    def template(self, *sets: str) -> list[dict[str, Any]]:
        out = self.run(
            "template", "kmodkit", str(CHART), "--kube-version", KUBERNETES_VERSION, *sets
        )
        return [d for d in yaml.safe_load_all(out.stdout) if d]


Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def grants(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in role.get("rules") or []
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
