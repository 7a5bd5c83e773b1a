"""The Module a ClusterPolicy's kernelModule becomes (Intel's mapping, field for field).

One Module ``<policy>-gpu`` in the operator namespace. The body is valid for
upstream KMM ``kmm.sigs.x-k8s.io/v1beta1`` and for kmodkit's
``kmodkit.io/v1alpha1`` alike; only ``apiVersion`` tells the engines apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmodkit.backends.intel_xe import settings as keys
from kmodkit.backends.intel_xe.api import MODULE_SUFFIX, ClusterPolicySpec, KernelMappingSpec
from kmodkit.backends.intel_xe.selectors import module_selector
from kmodkit.sdk import RegistryTLS


def module_name(policy_name: str) -> str:
    return f"{policy_name}{MODULE_SUFFIX}"


def _tls(tls: RegistryTLS) -> dict[str, bool]:
    return {"insecure": tls.insecure, "insecureSkipTLSVerify": tls.insecure_skip_tls_verify}


def _in_tree(module: str, extras: list[str]) -> list[str]:
    # KMM replaces the container's list with a mapping's, so a mapping's list
    # must name the in-tree driver too; first occurrence wins.
    return list(dict.fromkeys([module, *extras]))


def _mapping(
    mapping: KernelMappingSpec, module: str, selector: Mapping[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {"regexp": mapping.regexp, "containerImage": mapping.container_image}
    if mapping.in_tree_modules_to_remove:
        out["inTreeModulesToRemove"] = _in_tree(module, mapping.in_tree_modules_to_remove)
    if mapping.registry_tls is not None:
        out["registryTLS"] = _tls(mapping.registry_tls)
    if mapping.build is not None:
        build: dict[str, Any] = {
            "dockerfileConfigMap": {"name": mapping.build.dockerfile_config_map.name},
            # The build needs the target kernel's headers and toolchain, so it
            # runs on the nodes the driver is for.
            "selector": dict(selector),
        }
        if mapping.build.build_args:
            build["buildArgs"] = [a.to_wire() for a in mapping.build.build_args]
        if mapping.build.secrets:
            build["secrets"] = [s.to_wire() for s in mapping.build.secrets]
        out["build"] = build
    if mapping.sign is not None:
        out["sign"] = mapping.sign.to_wire()
    return out


def module_manifest(
    policy_name: str,
    spec: ClusterPolicySpec,
    namespace: str,
    api_version: str,
    settings: Mapping[str, str],
) -> dict[str, Any]:
    """The Module for ``spec.kernelModule`` (which must be set)."""
    km = spec.kernel_module
    assert km is not None
    selector = module_selector(spec)
    modprobe: dict[str, Any] = {"moduleName": km.module_name}
    if km.firmware_path:
        modprobe["firmwarePath"] = km.firmware_path
    if km.modules_loading_order:
        modprobe["modulesLoadingOrder"] = list(km.modules_loading_order)
    container: dict[str, Any] = {
        "modprobe": modprobe,
        "inTreeModulesToRemove": [km.module_name],
        "imagePullPolicy": "IfNotPresent",
        "kernelMappings": [_mapping(m, km.module_name, selector) for m in km.kernel_mappings],
    }
    if km.version:
        container["version"] = km.version
    if km.registry_tls is not None:
        container["registryTLS"] = _tls(km.registry_tls)
    if km.sign is not None:
        container["sign"] = km.sign.to_wire()
    loader: dict[str, Any] = {"container": container}
    if account := settings.get(keys.MODULE_LOADER_SERVICE_ACCOUNT):
        loader["serviceAccountName"] = account
    module_spec: dict[str, Any] = {
        "selector": selector,
        "tolerations": [t.to_wire() for t in spec.tolerations or []],
        "moduleLoader": loader,
    }
    if spec.pull_secret is not None:
        module_spec["imageRepoSecret"] = {"name": spec.pull_secret.name}
    return {
        "apiVersion": api_version,
        "kind": "Module",
        "metadata": {"name": module_name(policy_name), "namespace": namespace},
        "spec": module_spec,
    }
