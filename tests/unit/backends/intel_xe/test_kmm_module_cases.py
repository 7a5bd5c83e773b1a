"""The policies checked under KMM's schema cover what they claim (see kmm_module_cases).

The schema check itself is tests/integration/test_kmm_schema.py; these keep
its cases honest offline: each policy plans a KMM Module, and the every-field
policy really sends every field to KMM.
"""

from __future__ import annotations

import pytest

from kmodkit.backends.intel_xe.selectors import NFD_GPU_PCI_LABEL
from kmodkit.core.engine.module_rules import validate_module
from tests.unit.backends.intel_xe.kmm_module_cases import (
    DIGEST,
    LOADER_ACCOUNT,
    NEW_DIGEST,
    NO_EXECUTE,
    POLICIES,
    TEMPLATED_IMAGE,
    cluster_view,
    every_field_policy,
    kmm_module,
    signed_policy,
    updated_policy,
)


@pytest.mark.parametrize("account", [None, LOADER_ACCOUNT])
@pytest.mark.parametrize("namespace", ["kmodkit-system", "gpu-operators"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_policy_plans_one_kmm_module(name: str, namespace: str, account: str | None) -> None:
    policy = POLICIES[name]()
    module = kmm_module(policy, cluster_view(namespace, account))
    assert module["metadata"] == {
        "name": f"{policy['metadata']['name']}-gpu",
        "namespace": namespace,
    }
    assert module["spec"]["moduleLoader"].get("serviceAccountName") == account


def test_the_every_field_policy_sends_every_field() -> None:
    spec = kmm_module(every_field_policy(), cluster_view("kmodkit-system", None))["spec"]
    assert spec["selector"][NFD_GPU_PCI_LABEL] == "true"
    assert spec["selector"]["gpu.intel.com/exists"] == "true"
    assert spec["imageRepoSecret"] == {"name": "xe-registry"}
    assert NO_EXECUTE in spec["tolerations"]
    container = spec["moduleLoader"]["container"]
    assert container["version"] == "v7.1.4.8_260728.8"
    assert container["registryTLS"] == {"insecure": True, "insecureSkipTLSVerify": False}
    assert container["modprobe"] == {
        "moduleName": "xe",
        "firmwarePath": "/firmware",
        "modulesLoadingOrder": ["xe", "drm_buddy", "drm_gpuvm"],
    }
    built, by_digest, by_tag_and_digest = container["kernelMappings"]
    assert built["containerImage"] == TEMPLATED_IMAGE
    assert built["registryTLS"] == {"insecure": False, "insecureSkipTLSVerify": True}
    assert built["inTreeModulesToRemove"] == ["xe", "intel_pmc_core", "intel-vsec"]
    assert built["build"]["secrets"] == [{"name": "xe-source-token"}]
    assert {"name": "IMAGE_PATH", "value": "${MOD_NAMESPACE}/$MOD_NAME"} in built["build"][
        "buildArgs"
    ]
    assert by_digest["containerImage"].endswith(f"@{DIGEST}")
    assert by_tag_and_digest["containerImage"].endswith(f":v1@{DIGEST}")
    assert built["sign"] == {
        "keySecret": {"name": "xe-signing-key"},
        "certSecret": {"name": "xe-signing-cert"},
        "filesToSign": ["/opt/lib/modules/${KERNEL_FULL_VERSION}/updates/*.ko"],
    }


def test_the_signed_policy_signs_every_mapping_from_its_unsigned_image() -> None:
    module = kmm_module(signed_policy(), cluster_view("kmodkit-system", None))
    # The built-in engine takes the same body under its own apiVersion, sign and all.
    assert validate_module({**module, "apiVersion": "kmodkit.io/v1alpha1"}) == []
    container = module["spec"]["moduleLoader"]["container"]
    sign = signed_policy()["spec"]["kernelModule"]["sign"]
    sign["unsignedImageRegistryTLS"]["insecure"] = False  # the model's default, written out
    assert container["sign"] == sign


def test_the_update_is_applied_to_the_live_module_in_place() -> None:
    live = kmm_module(every_field_policy(), cluster_view("kmodkit-system", None))
    changed = kmm_module(
        updated_policy(every_field_policy()),
        cluster_view("kmodkit-system", LOADER_ACCOUNT, owned=[live]),
    )
    assert changed["metadata"] == live["metadata"]
    loader = changed["spec"]["moduleLoader"]
    assert loader["serviceAccountName"] == LOADER_ACCOUNT
    assert loader["container"]["version"] == "v7.1.4.9_260901.1"
    assert loader["container"]["kernelMappings"][1]["containerImage"].endswith(NEW_DIGEST)
    assert len(loader["container"]["kernelMappings"]) == 4
    assert changed["spec"]["tolerations"][-1] == {"operator": "Exists"}
