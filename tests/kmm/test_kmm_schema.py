"""Every Module the Intel backend emits is accepted under upstream KMM's own schema.

The only check that needs KMM's real Module CRD (lifecycle, claim guard and
readiness gating are tested on the built-in engine in
tests/integration/test_intel_lifecycle.py). No KMM controller runs: this checks
what the operator asks of KMM, not KMM itself.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kmodkit.backends.intel_xe.plan import plan
from kmodkit.core.contract.backend import ClusterView

KMM_GROUP, KMM_VERSION, MODULES = "kmm.sigs.x-k8s.io", "v1beta1", "modules"
SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "samples" / "clusterpolicy-ubuntu26.04.yaml"

pytestmark = pytest.mark.cluster


def _policies() -> list[dict[str, Any]]:
    """The documented sample, and the sample with every optional Module field set."""
    sample = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    full = copy.deepcopy(sample)
    full["spec"].update(
        useNFDLabeling=True,
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    km = full["spec"]["kernelModule"]
    km.update(version="v7.1.4.8", registryTLS={"insecure": True})
    km["kernelMappings"][0].update(
        registryTLS={"insecureSkipTLSVerify": True},
        build={**km["kernelMappings"][0]["build"], "secrets": [{"name": "src"}]},
    )
    km["kernelMappings"].append({"regexp": "^6[.]8", "containerImage": "reg.local/xe:6.8"})
    return [sample, full]


def test_every_module_the_backend_emits_is_valid_for_kmm(
    kmm_module_crd: dict[str, Any], kube_api: Any
) -> None:
    view = ClusterView(
        nodes=[],
        api_groups=frozenset({KMM_GROUP}),
        operator_namespace="default",
        watched={},
        settings={"KMODKIT_INTEL_MODULE_LOADER_SERVICE_ACCOUNT": "module-loader"},
    )
    objects = client.CustomObjectsApi(kube_api)
    for policy in _policies():
        (module,) = [o for o in plan(policy, view).objects if o["kind"] == "Module"]
        assert module["apiVersion"] == f"{KMM_GROUP}/{KMM_VERSION}"
        # Strict: a field KMM's schema does not know is an error, not silently pruned.
        created = objects.create_namespaced_custom_object(
            KMM_GROUP,
            KMM_VERSION,
            "default",
            MODULES,
            module,
            dry_run="All",
            field_validation="Strict",
        )
        # Every field sent came back: nothing was pruned (KMM may add defaults).
        assert _kept(module["spec"], created["spec"]), created["spec"]


def _kept(sent: Any, stored: Any) -> bool:
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            k in stored and _kept(v, stored[k]) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return (
            isinstance(stored, list)
            and len(sent) == len(stored)
            and all(_kept(a, b) for a, b in zip(sent, stored, strict=True))
        )
    return bool(sent == stored)
