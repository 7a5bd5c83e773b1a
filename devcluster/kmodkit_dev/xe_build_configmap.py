"""The ConfigMap that delivers dockerfiles/intel-xe/Dockerfile to in-cluster builds.

``python -m kmodkit_dev.xe_build_configmap`` rewrites
docs/samples/xe-build-configmap.yaml from the Dockerfile; a unit test fails
when the two drift.
"""

from __future__ import annotations

from typing import Any

import yaml

from kmodkit_dev.repo import ROOT

DOCKERFILE = ROOT / "dockerfiles" / "intel-xe" / "Dockerfile"
SAMPLE = ROOT / "docs" / "samples" / "xe-build-configmap.yaml"
NAME = "xe-build-u26.04"
NAMESPACE = "kmodkit-system"
HEADER = (
    "# Generated from dockerfiles/intel-xe/Dockerfile by "
    "`python -m kmodkit_dev.xe_build_configmap`. Do not edit.\n"
    "# It must live in the operator's namespace; change the namespace if yours differs.\n"
)


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as YAML block literals, so the Dockerfile stays readable."""


def _literal(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_LiteralDumper.add_representer(str, _literal)


def configmap(dockerfile: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": namespace},
        "data": {"dockerfile": dockerfile},
    }


def render(dockerfile: str) -> str:
    return HEADER + yaml.dump(
        configmap(dockerfile), Dumper=_LiteralDumper, sort_keys=False, width=1000
    )


if __name__ == "__main__":
    SAMPLE.write_text(render(DOCKERFILE.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {SAMPLE.relative_to(ROOT)}")
