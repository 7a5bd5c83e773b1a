"""Every status a plan writes survives the apiserver: nothing in it is pruned.

The apiserver drops, without an error, any status field the CRD's structural
schema does not declare, so a writer that drifts from the model the CRD is
generated from loses that field silently. Each resource's statuses are made
here by its real plan over inputs that reach every branch adding fields, then
checked against the generated CRD and read through that same model.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from kmodkit.backends import intel_xe, tenstorrent
from kmodkit.backends.intel_xe.plan import plan as intel_plan
from kmodkit.backends.tenstorrent import driver_plan, firmware_plan
from kmodkit.core.api import Module
from kmodkit.core.cli.crds import generated_documents
from kmodkit.core.contract.backend import Obj, Plan, Resource, RolloutStatusFn
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus, LoaderPlan
from kmodkit.core.engine.loader_plan import plan as loader_plan
from kmodkit.core.engine.module_status import module_status
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.observed import NodeRecord
from kmodkit.core.rollout.observed import NodeView as RolloutNode
from kmodkit.core.rollout.plan import Context
from kmodkit.core.rollout.plan import plan as rollout_plan
from kmodkit.core.rollout.states import State
from kmodkit.core.rollout.status import summarize
from kmodkit.core.schema.crd import MODULE_CRD, crd_manifest
from tests.plugins.install import PLUGINS
from tests.unit.backends import test_plugins_example as acme
from tests.unit.backends.intel_xe import test_intel_plan as intel
from tests.unit.backends.tenstorrent import test_tt_plans as tt
from tests.unit.core.engine import test_loader_plan as loader

Statuses = dict[str, Mapping[str, Any]]
"""Statuses one plan writes, by the case that produced them."""


# -- the checker --------------------------------------------------------------


def json_type(value: Any) -> str:
    """The JSON-schema type of a value as it goes on the wire."""
    # bool first: in Python it is an int.
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def unkept(schema: Mapping[str, Any], value: Any, path: str = "status") -> list[str]:
    """Every path in ``value`` the apiserver would prune or refuse under ``schema``, and why."""
    if value is None:
        # The generator never writes `nullable` (test_crds holds it to that),
        # and the apiserver prunes a null where the schema does not allow one.
        return [f"{path}: null, pruned"]
    wanted, actual = schema.get("type"), json_type(value)
    # An untyped node is int-or-string, the only one the generator writes.
    if wanted is not None and wanted != actual:
        return [f"{path}: {actual} where the schema says {wanted}"]
    if wanted == "object":
        return [
            problem
            for key, child in value.items()
            for problem in _unkept_field(schema, key, child, f"{path}.{key}")
        ]
    if wanted == "array":
        return [
            problem
            for i, item in enumerate(value)
            for problem in unkept(schema["items"], item, f"{path}[{i}]")
        ]
    return []


def _unkept_field(schema: Mapping[str, Any], key: str, value: Any, path: str) -> list[str]:
    properties = schema.get("properties") or {}
    if key in properties:
        return unkept(properties[key], value, path)
    if isinstance(schema.get("additionalProperties"), Mapping):
        return unkept(schema["additionalProperties"], value, path)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    return [f"{path}: not in the schema, pruned"]


def test_the_checker_names_every_path_the_apiserver_would_prune() -> None:
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "ok": {"type": "boolean"},
            "nodes": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    kept = {
        "count": 1,
        "ok": False,
        "nodes": [{"name": "a"}],
        "labels": {"any": "x"},
        "raw": {"anything": {"at": ["all"]}},
    }
    assert unkept(schema, kept) == []
    assert unkept(
        schema,
        {
            "count": "1",
            "ok": 1,
            "nodes": [{"name": "a"}, {"name": "b", "stray": 0}, "c"],
            "labels": {"n": 2},
            "gone": {},
            "raw": None,
        },
    ) == [
        "status.count: string where the schema says integer",
        "status.ok: integer where the schema says boolean",
        "status.nodes[1].stray: not in the schema, pruned",
        "status.nodes[2]: string where the schema says object",
        "status.labels.n: integer where the schema says string",
        "status.gone: not in the schema, pruned",
        "status.raw: null, pruned",
    ]


# -- where the schema and the model come from ---------------------------------


@cache
def _generated_crds() -> dict[str, dict[str, Any]]:
    """The CRDs `kmodkit crds` writes, by kind."""
    return {
        doc["spec"]["names"]["kind"]: doc
        for docs in generated_documents().values()
        for doc in docs
        if doc["kind"] == "CustomResourceDefinition"
    }


def _status_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    (served,) = [v for v in crd["spec"]["versions"] if v["served"]]
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def _refusal(model: type[BaseModel], obj: Mapping[str, Any]) -> str:
    try:
        model.model_validate(obj)
    except ValidationError as err:
        return str(err)
    return ""


def assert_kept(statuses: Statuses, crd: Mapping[str, Any], model: type[BaseModel]) -> None:
    """Nothing in any of ``statuses`` is pruned by ``crd``, and ``model`` reads each."""
    schema = _status_schema(crd)
    pruned = {case: unkept(schema, status) for case, status in statuses.items()}
    assert {case: paths for case, paths in pruned.items() if paths} == {}
    refused = {case: _refusal(model, status) for case, status in statuses.items()}
    assert {case: why for case, why in refused.items() if why} == {}


def _resource(kind: str) -> Resource:
    """The built-in backend resource serving ``kind``."""
    resources = (*intel_xe.backend.resources, *tenstorrent.backend.resources)
    (resource,) = [r for r in resources if r.crd.kind == kind]
    return resource


# -- Module -------------------------------------------------------------------


def module_statuses() -> Statuses:
    m = loader.module()
    body = {
        **m.to_wire(),
        "metadata": {"name": loader.NAME, "namespace": loader.NS, "generation": 2},
    }
    a, b = loader.node("a"), loader.node("b", loader.K2)
    images = loader.all_exist(m, [a, b])
    loaded = loader_plan(
        m, [a, b], [loader.running(m, a), loader.running(m, b)], images, loader.SETTINGS
    )
    first = module_status(body, loaded)
    # Image missing on one kernel (a mapping applied), building on the other,
    # no mapping at all on a third (none applied).
    troubled = {
        f"r.io/xe:{loader.K1}": ImageStatus(ImageState.MISSING),
        f"r.io/xe:{loader.K2}": ImageStatus(ImageState.BUILDING),
    }
    rhel = loader.node("rhel", "5.14.0-427.el9.x86_64")
    failing = loader_plan(m, [a, b, rhel], [], troubled, loader.SETTINGS)
    fleet = [loader.node(f"n{i:02}", "5.14.0-427.el9.x86_64") for i in range(60)]
    versioned = loader.module(version="v2")
    labelled = loader.node("a", **{loader.WANT: "v2"})
    raw_args = loader.module(modprobe={"rawArgs": {"load": ["xe"], "unload": ["-r", "xe"]}})
    # What the controller writes for an object the apiserver admitted but the model refuses.
    invalid = {**body, "spec": {**body["spec"], "selector": "gpu=intel"}}
    return {
        "first load": module_status(body, loader_plan(m, [a, b], [], images, loader.SETTINGS)),
        "all loaded": first,
        "all loaded, again": module_status({**body, "status": first}, loaded),
        "rebuild triggered": module_status(
            {**body, "spec": {**body["spec"], "imageRebuildTriggerGeneration": 2}}, loaded
        ),
        "nodes failing and building": module_status(body, failing),
        "more failures than listed": module_status(
            body, loader_plan(m, fleet, [], {}, loader.SETTINGS)
        ),
        "awaiting version labels": module_status(
            body,
            loader_plan(
                versioned,
                [labelled, loader.node("b")],
                [],
                loader.all_exist(versioned, [labelled]),
                loader.SETTINGS,
            ),
        ),
        "module error": module_status(body, loader_plan(raw_args, [a], [], {}, loader.SETTINGS)),
        "invalid object": module_status(body, LoaderPlan(), invalid=_refusal(Module, invalid)),
    }


def test_module_statuses_fit_the_module_crd() -> None:
    assert_kept(module_statuses(), _generated_crds()[MODULE_CRD.kind], MODULE_CRD.status_model)


# -- ClusterPolicy ------------------------------------------------------------


def cluster_policy_statuses() -> Statuses:
    km = intel.kernel_module
    body, view, live, module_of = intel.body, intel.view, intel.live, intel.module_of
    kmm_module = module_of(intel_plan(body(kernelModule=km()), view(intel.KMM)))
    builtin_module = module_of(intel_plan(body(kernelModule=km()), view()))
    terminating = live(kmm_module, deletionTimestamp="2026-01-01T00:00:00Z")
    bad_mapping = km()
    bad_mapping["kernelMappings"][0]["regexp"] = "(?=7)"
    dra = intel_plan(body(resourceRegistration="dra"), view())
    dra_running: list[Obj] = [
        {**o, "status": {"numberReady": 1, "desiredNumberScheduled": 1}} for o in dra.objects
    ]
    first = intel_plan(body(), view())
    cases = {
        "device plugin only": first,
        "device plugin only, again": intel_plan({**body(), "status": first.status}, view()),
        "module rolling out": intel_plan(
            body(kernelModule=km()), view(intel.KMM, owned=[live(kmm_module, 1, 3)])
        ),
        "module loaded": intel_plan(
            body(kernelModule=km()), view(intel.KMM, owned=[live(kmm_module, 3, 3)])
        ),
        "forced engine missing": intel_plan(body(kernelModule=km(engine="KMM")), view()),
        "unknown engine setting": intel_plan(
            body(kernelModule=km()), view(intel.KMM, KMODKIT_INTEL_ENGINE="bogus")
        ),
        "engine switch": intel_plan(
            body(kernelModule=km()), view(intel.KMM, owned=[live(builtin_module, 1, 1)])
        ),
        "version switch": intel_plan(
            body(kernelModule=km(version="v2")), view(intel.KMM, owned=[live(kmm_module, 2, 2)])
        ),
        "module removal": intel_plan(body(), view(intel.KMM, owned=[live(kmm_module, 2, 2)])),
        "module pending deletion": intel_plan(body(), view(intel.KMM, owned=[terminating])),
        "module held by claims": intel_plan(
            body(), view(intel.KMM, owned=[live(kmm_module, 2, 2)], claims=[intel.CLAIM])
        ),
        "invalid kernel module": intel_plan(
            body(kernelModule=bad_mapping), view(intel.KMM, owned=[live(kmm_module, 1, 1)])
        ),
        "dra with monitoring": intel_plan(
            body(resourceRegistration="dra", resourceMonitoring=True), view()
        ),
        "dra disabled, nfd missing, no admin access": intel_plan(
            body(resourceRegistration="dra", useNFDLabeling=True, resourceMonitoring=True),
            view(admin_access=False, KMODKIT_INTEL_DRA="disabled"),
        ),
        "dra removal held by claims": intel_plan(
            body(), view(owned=dra_running, claims=[intel.CLAIM])
        ),
        "invalid spec": intel_plan(body(resourceRegistration="bogus"), view()),
    }
    return {case: p.status for case, p in cases.items()}


def test_cluster_policy_statuses_fit_the_cluster_policy_crd() -> None:
    source = _resource("ClusterPolicy").crd
    assert_kept(cluster_policy_statuses(), _generated_crds()[source.kind], source.status_model)


# -- Tenstorrent ----------------------------------------------------------------


def _rolled_out(plan: Plan, merge: RolloutStatusFn, **states: State) -> Mapping[str, Any]:
    """The plan's status after one rollout pass over nodes in ``states``, merged as the
    runtime merges it, every step of the pass accepted.

    A failed node failed at the current target, so the pass keeps it failed and
    reports the reason it failed with.
    """
    request = plan.rollout
    assert request is not None
    nodes = [
        RolloutNode(
            name=name,
            state=state,
            needs_update=True,
            record=NodeRecord(
                target=request.target,
                reason="ValidationTimedOut" if state is State.FAILED else "",
                message="the node did not report healthy in time" if state is State.FAILED else "",
            ),
        )
        for name, state in states.items()
    ]
    ctx = Context(
        request.policy,
        RolloutKeys.for_policy(request.policy_id),
        request.target,
        now=0.0,
        paused=request.paused,
    )
    planned = rollout_plan(nodes, ctx)
    merged = merge(plan.status, summarize(nodes, planned, planned.steps))
    # The case is only worth having if the pass's reasons reach status.nodes.
    assert merged["nodes"] != plan.status["nodes"]
    return merged


def driver_statuses() -> Statuses:
    digest = tt._digest()
    state = "rollout.kmodkit.io/ttdp.default"
    version = "driver.tenstorrent.com/kmd-version"
    pull: dict[str, Any] = {
        "containerStatuses": [{"name": "builder", "state": {"waiting": {"reason": "ErrImagePull"}}}]
    }
    crash: dict[str, Any] = {
        "containerStatuses": [
            {
                "name": "builder",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            }
        ]
    }
    nodes = [
        tt._node("done", **{version: "2.9.0"}),
        tt._node("host", **{"driver.tenstorrent.com/install-mode": "host"}),
        tt._node("skipped", **{"driver.tenstorrent.com/skip": "true"}),
        tt._node("pull", **{version: "2.8.0"}),
        tt._node("crash", **{version: "2.8.0"}),
        tt._node("old", **{version: "2.8.0"}),
        tt._node("building"),
        tt._node("no-builder"),
        tt._node("waiting", **{state: "required"}),
        tt._node("cordoning", **{state: "cordoning"}),
        tt._node("draining", **{state: "evicting"}),
        tt._node("swapping", **{state: "swapping"}),
        tt._node("uncordoning", **{state: "uncordoning"}),
        tt._node("failed", **{state: "failed"}),
    ]
    pods = [
        tt._pod("done", digest),
        tt._pod("pull", digest, ready=False, **pull),
        tt._pod("crash", digest, ready=False, **crash),
        tt._pod("old", "0ld", version="2.8.0"),
        tt._pod("building", digest, ready=False),
    ]
    every_state = driver_plan.plan_at(tt._ttdp(), tt._view(nodes, pods), tt.NOW)
    converged = driver_plan.plan_at(tt._ttdp(), tt._view(nodes[:1], pods[:1]), tt.NOW)
    fleet = [tt._node(f"n{i:03}") for i in range(101)]
    invalid = tt._ttdp(upgradePolicy={"drain": {"podSelectorLabel": "a in b"}})
    return {
        "every node state": every_state.status,
        "rollout pass merged": _rolled_out(
            every_state, driver_plan.rollout_status, waiting=State.REQUIRED, failed=State.FAILED
        ),
        "converged": converged.status,
        "converged, again": driver_plan.plan_at(
            {**tt._ttdp(), "status": converged.status}, tt._view(nodes[:1], pods[:1]), tt.NOW
        ).status,
        "no nodes": driver_plan.plan_at(tt._ttdp(), tt._view([]), tt.NOW).status,
        "paused without builders": driver_plan.plan_at(
            tt._ttdp(paused=True), tt._view([tt._node("a")], owned=False), tt.NOW
        ).status,
        "more nodes than listed": driver_plan.plan_at(tt._ttdp(), tt._view(fleet), tt.NOW).status,
        "invalid spec": driver_plan.plan_at(invalid, tt._view([]), tt.NOW).status,
        "invalid spec after a good pass": driver_plan.plan_at(
            {**invalid, "status": every_state.status}, tt._view([]), tt.NOW
        ).status,
    }


def test_driver_policy_statuses_fit_the_driver_policy_crd() -> None:
    source = _resource("TenstorrentDriverPolicy").crd
    assert_kept(driver_statuses(), _generated_crds()[source.kind], source.status_model)


def firmware_statuses() -> Statuses:
    state = "rollout.kmodkit.io/ttfwp.fw"
    current = "firmware.tenstorrent.com/fw-version"
    nodes = [
        tt._node("done", **{current: "19.9.0.0"}),
        tt._node("old", **{current: "19.8.0.0"}),
        tt._node("skipped", **{"firmware.tenstorrent.com/skip": "true"}),
        tt._node("waiting", **{state: "required"}),
        tt._node("draining", **{state: "draining"}),
        tt._node("flashing", **{state: "swapping"}),
        tt._node("validating", **{state: "validating"}),
        tt._node("flashed", **{state: "done", current: "19.9.0.0"}),
        tt._node("failed", **{state: "failed"}),
    ]
    every_state = firmware_plan.plan_at(tt._ttfwp(), tt._view(nodes), tt.NOW)
    off = firmware_plan.plan_at(tt._ttfwp(generation=4), tt._view(nodes[:2]), tt.NOW)
    forced = firmware_plan.plan_at(
        tt._ttfwp(dict(off.status), 5, flasher={"forceWrite": True}), tt._view(nodes[:2]), tt.NOW
    )
    fleet = [tt._node(f"n{i:03}") for i in range(101)]
    invalid = tt._ttfwp(upgradePolicy={"drain": {"podSelectorLabel": "a in b"}})
    return {
        "every node state": every_state.status,
        "rollout pass merged": _rolled_out(
            every_state, firmware_plan.rollout_status, waiting=State.REQUIRED, failed=State.FAILED
        ),
        "drift only": firmware_plan.plan_at(
            tt._ttfwp(upgradePolicy={"autoUpgrade": False}), tt._view(nodes[:2]), tt.NOW
        ).status,
        "paused": firmware_plan.plan_at(tt._ttfwp(paused=True), tt._view(nodes[:2]), tt.NOW).status,
        "force write off": off.status,
        "force write on": forced.status,
        "force write kept": firmware_plan.plan_at(
            tt._ttfwp(dict(forced.status), 6, flasher={"forceWrite": True}),
            tt._view(nodes[:2]),
            tt.NOW,
        ).status,
        "more nodes than listed": firmware_plan.plan_at(
            tt._ttfwp(), tt._view(fleet), tt.NOW
        ).status,
        "invalid spec": firmware_plan.plan_at(invalid, tt._view([]), tt.NOW).status,
        "invalid spec after a good pass": firmware_plan.plan_at(
            {**invalid, "status": every_state.status}, tt._view([]), tt.NOW
        ).status,
    }


def test_firmware_policy_statuses_fit_the_firmware_policy_crd() -> None:
    source = _resource("TenstorrentFirmwarePolicy").crd
    assert_kept(firmware_statuses(), _generated_crds()[source.kind], source.status_model)


# -- the example backend ------------------------------------------------------


@pytest.fixture(scope="module")
def acme_driver() -> Resource:
    # Imported from its source, as test_plugins_example does: it is not
    # installed, so `kmodkit crds` does not list it and its CRD is generated
    # here by the same function from its CrdSource.
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(PLUGINS / "kmodkit-example"))
        resource: Resource
        (resource,) = importlib.import_module("kmodkit_example").backend.resources
    return resource


def test_acme_driver_statuses_fit_the_acme_driver_crd(acme_driver: Resource) -> None:
    owned = (
        {"kind": "Module", "status": {"moduleLoader": {"availableNumber": 3}}},
        {"kind": "DaemonSet", "status": {"numberReady": 2}},
    )
    statuses = {
        "nothing running yet": acme_driver.plan(acme.DRIVER, acme._view()).status,
        "module and device plugin running": acme_driver.plan(
            acme.DRIVER, acme._view(owned=owned)
        ).status,
    }
    source = acme_driver.crd
    assert_kept(statuses, crd_manifest(source), source.status_model)
