"""OpenShift's SecurityContextConstraints CRD, for checking the SCCs kmodkit writes.

The CRD is read from ``github.com/openshift/api`` at a pinned version, fetched
through the Go module proxy (``go mod download``; the module's zip is about
5 MB and cached by Go), so an SCC the Intel backend or the chart makes is
checked against OpenShift's own schema, not a copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Final

import yaml

MODULE: Final = "github.com/openshift/api"
VERSION: Final = "v0.0.0-20251111013132-5c461e21bdb7"
SCC_CRD: Final = (
    "security/v1/zz_generated.crd-manifests/"
    "0000_03_config-operator_01_securitycontextconstraints.crd.yaml"
)


def scc_crd() -> dict[str, Any]:
    """OpenShift's ``securitycontextconstraints.security.openshift.io`` CRD."""
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        env=env,
        cwd=tempfile.gettempdir(),  # outside any Go module
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    directory = Path(json.loads(out)["Dir"])
    crd: dict[str, Any] = yaml.safe_load((directory / SCC_CRD).read_text(encoding="utf-8"))
    return crd
