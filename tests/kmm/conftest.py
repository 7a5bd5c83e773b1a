"""KMM's own CRDs, from a kernel-module-management checkout named by KMODKIT_KMM_CRDS.

Nothing of KMM is committed or fetched here: the Go module proxy refuses
``sigs.k8s.io/kernel-module-management`` (403, "This module version is not
available"), so the CRDs come from a checkout the developer provides. `make
test` never collects this directory (``norecursedirs`` in pyproject.toml);
``make test-kmm KMODKIT_KMM_CRDS=<checkout>/config/crd/bases`` runs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit_dev.manifests import apply, wait_established
from tests.integration.crds_util import install

ENV = "KMODKIT_KMM_CRDS"
MODULE_CRD = "kmm.sigs.x-k8s.io_modules.yaml"


def kmm_crds_dir() -> Path:
    given = os.environ.get(ENV, "").strip()
    if not given:
        pytest.fail(
            f"{ENV} is not set: point it at the config/crd/bases directory of a "
            "kernel-module-management checkout (see docs/development.md, 'KMM schema check')",
            pytrace=False,
        )
    path = Path(given).expanduser()
    if not (path / MODULE_CRD).is_file():
        pytest.fail(
            f"{ENV}={given}: no {MODULE_CRD} there; it must be KMM's config/crd/bases directory",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
def kmm_module_crd(kube_api: Any) -> Iterator[dict[str, Any]]:
    """KMM's Module CRD installed next to kmodkit's; removed again afterwards."""
    crd = dict(yaml.safe_load((kmm_crds_dir() / MODULE_CRD).read_text(encoding="utf-8")))
    install(kube_api)
    apply(kube_api, crd)
    wait_established(kube_api, crd["metadata"]["name"])
    yield crd
    try:
        client.ApiextensionsV1Api(kube_api).delete_custom_resource_definition(
            crd["metadata"]["name"]
        )
    except ApiException as err:
        if err.status != 404:
            raise
