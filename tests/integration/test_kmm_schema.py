"""Every Module the Intel backend emits for KMM is accepted under upstream KMM's own schema.

KMM's real CRDs (pinned by commit and sha256, see kmodkit_dev.kmm_crds) are
installed into the control plane, and each Module is sent as the operator
sends it, as a strict server-side dry run: a field KMM's schema does not know
is an error rather than silently pruned, and a wrong type or a missing
required field is refused. No KMM controller runs: this checks what the
operator asks of KMM, not KMM itself. Lifecycle, claim guard and readiness
gating are tested on the built-in engine (test_intel_lifecycle.py); the
policies are described, and held to what they cover, in
tests/unit/backends/intel_xe/kmm_module_cases.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit.sdk import FIELD_MANAGER
from kmodkit_dev import kmm_crds
from kmodkit_dev import manifests as devmanifests
from tests.unit.backends.intel_xe.kmm_module_cases import (
    LOADER_ACCOUNT,
    POLICIES,
    cluster_view,
    every_field_policy,
    kmm_module,
    updated_policy,
)

KMM_GROUP, KMM_VERSION, MODULES = "kmm.sigs.x-k8s.io", "v1beta1", "modules"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def kmm_api(kube_api: Any) -> Iterator[None]:
    """KMM's CRDs served by the apiserver; removed afterwards, so no other test sees KMM
    installed (the Intel backend would pick it as its engine)."""
    try:
        crds = kmm_crds.install(kube_api)
    except kmm_crds.KmmCrdError as err:
        pytest.fail(str(err), pytrace=False)
    yield
    kmm_crds.uninstall(kube_api, crds)


@pytest.fixture(scope="module")
def namespaces(kube_api: Any) -> Iterator[dict[str, str]]:
    """Two operator namespaces: the Module's namespace is part of what KMM is sent."""
    core: Any = client.CoreV1Api(kube_api)
    made = {which: f"kmm-{which}-{uuid.uuid4().hex[:6]}" for which in ("first", "second")}
    for name in made.values():
        core.create_namespace({"metadata": {"name": name}})
    yield made
    for name in made.values():
        core.delete_namespace(name, propagation_policy="Background")


def _apply(kube_api: Any, module: dict[str, Any], dry_run: str | None = None) -> dict[str, Any]:
    """Server-side apply, as the operator applies its Modules, with strict field validation."""
    meta = module["metadata"]
    objects: Any = client.CustomObjectsApi(kube_api)
    response = objects.patch_namespaced_custom_object(
        KMM_GROUP,
        KMM_VERSION,
        meta["namespace"],
        MODULES,
        meta["name"],
        module,
        field_manager=FIELD_MANAGER,
        force=True,
        dry_run=dry_run,
        field_validation="Strict",
        _content_type=devmanifests.APPLY,
        # The client cannot deserialise an apply's answer into a dict by itself.
        _preload_content=False,
    )
    answer: dict[str, Any] = json.loads(response.data)
    return answer


@pytest.mark.parametrize("account", [None, LOADER_ACCOUNT], ids=["default-loader", "loader-sa"])
@pytest.mark.parametrize("which", ["first", "second"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_module_is_valid_for_kmm(
    kmm_api: None,
    namespaces: dict[str, str],
    kube_api: Any,
    name: str,
    which: str,
    account: str | None,
) -> None:
    module = kmm_module(POLICIES[name](), cluster_view(namespaces[which], account))
    created = _apply(kube_api, module, dry_run="All")
    # Every field sent came back: nothing was pruned (KMM adds its defaults).
    assert _kept(module["spec"], created["spec"]), created["spec"]
    assert created["metadata"]["namespace"] == namespaces[which]


def test_an_in_place_update_is_valid_for_kmm(
    kmm_api: None, namespaces: dict[str, str], kube_api: Any
) -> None:
    namespace = namespaces["first"]
    policy = every_field_policy()
    # Its own name, so no dry-run create of the same Module meets this live one.
    policy["metadata"]["name"] = "xe-update"
    live = _apply(kube_api, kmm_module(policy, cluster_view(namespace, None)))
    objects: Any = client.CustomObjectsApi(kube_api)
    try:
        changed = kmm_module(
            updated_policy(policy), cluster_view(namespace, LOADER_ACCOUNT, owned=[live])
        )
        answered = _apply(kube_api, changed, dry_run="All")
        assert answered["metadata"]["uid"] == live["metadata"]["uid"], "not an update in place"
        assert _kept(changed["spec"], answered["spec"]), answered["spec"]
        stored = objects.get_namespaced_custom_object(
            KMM_GROUP, KMM_VERSION, namespace, MODULES, live["metadata"]["name"]
        )
        assert stored["spec"] == live["spec"], "the dry run changed the stored Module"
    finally:
        objects.delete_namespaced_custom_object(
            KMM_GROUP, KMM_VERSION, namespace, MODULES, live["metadata"]["name"]
        )


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
