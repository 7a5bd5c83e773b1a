"""The ClusterPolicy plan: from a policy and what the runtime observed, everything it owns.

Pure: the runtime applies the objects (owner-referenced to the policy, so
deleting the policy garbage-collects them), prunes what is no longer planned,
and writes the status. Errors come in the order Intel's operator reports
them: device plugin, XPU Manager, DRA, NFD, kernel module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kmodkit.backends.intel_xe import (
    device_plugin,
    dra_driver,
    nfd_rule,
    prometheus,
    xpu_manager,
)
from kmodkit.backends.intel_xe.api import ClusterPolicySpec
from kmodkit.backends.intel_xe.claims import CLAIMS, allocated_gpu_claims
from kmodkit.backends.intel_xe.engine import choose_engine
from kmodkit.backends.intel_xe.module import module_manifest, module_name
from kmodkit.backends.intel_xe.module_lifecycle import BLOCKING, ModuleOutcome, decide, held
from kmodkit.backends.intel_xe.openshift import SCC_GROUP
from kmodkit.backends.intel_xe.operand import Operands
from kmodkit.backends.intel_xe.rules import kernel_module_problems, name_problems
from kmodkit.backends.intel_xe.selectors import arch_conflict, operand_selector
from kmodkit.backends.intel_xe.settings import dra_served
from kmodkit.backends.intel_xe.status import (
    MAX_BLOCKING_CLAIMS,
    bounded,
    conditions,
    daemon_set_observed,
    daemon_set_status,
    progress,
    progress_of,
)
from kmodkit.sdk import (
    KMM_API_VERSION,
    MODULE_READY_LABEL,
    ApplyFailure,
    ClusterView,
    LabelKeyError,
    Obj,
    Plan,
    schema_problems,
)

DRA_DISABLED = "DRA is not enabled in the cluster, but ClusterPolicy requests it."
NFD_MISSING = (
    "useNFDLabeling is set but NFD (nfd.k8s-sigs.io) is not installed, so no node gets the "
    "intel.feature.node.kubernetes.io labels the components select; install NFD or label "
    "the nodes"
)


def plan(body: Obj, view: ClusterView) -> Plan:
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    try:
        spec = ClusterPolicySpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        # Only a policy stored before a schema change gets here; keep what runs.
        problems = [f"spec.{p.path}: {p.message}" for p in schema_problems(err)]
        return Plan(objects=[held(o) for o in view.owned], status={"errors": bounded(problems)})
    return _plan(name, meta.get("generation"), body.get("status") or {}, spec, view)


def _plan(
    name: str,
    generation: int | None,
    old: dict[str, Any],
    spec: ClusterPolicySpec,
    view: ClusterView,
) -> Plan:
    namespace, settings = view.operator_namespace, view.settings
    claims = allocated_gpu_claims(view.watched.get(CLAIMS.name, ()))
    module, engine, ready_label = _kernel_module(name, spec, view, claims)

    ops = Operands(
        name,
        spec,
        namespace,
        operand_selector(spec, ready_label),
        settings,
        openshift=SCC_GROUP in view.api_groups,
    )
    dra_wanted = spec.resource_registration == "dra"
    dra_planned = dra_wanted and dra_served(settings, view.api_groups)
    objects: list[dict[str, Any]] = []
    errors: list[str] = [conflict] if (conflict := arch_conflict(spec)) else []
    if spec.resource_registration == "dp":
        objects += device_plugin.manifests(ops)
    admin_namespaces = {
        (n.get("metadata") or {}).get("name")
        for n in view.watched.get(xpu_manager.ADMIN_NAMESPACES.name, ())
    }
    xpu_planned = spec.resource_monitoring and (not dra_planned or namespace in admin_namespaces)
    if xpu_planned:
        objects += xpu_manager.manifests(ops, dra_claims=dra_planned)
    elif spec.resource_monitoring:
        errors.append(
            xpu_manager.ADMIN_ACCESS_MISSING.format(
                label=xpu_manager.ADMIN_ACCESS_LABEL, namespace=namespace
            )
        )
    if dra_planned:
        objects += dra_driver.manifests(ops)
    else:
        if dra_wanted:
            errors.append(DRA_DISABLED)
        kept = _dra_objects(name, view.owned) if claims else []
        if kept:
            objects += [held(o) for o in kept]
            errors.append(f"{BLOCKING} removal of the DRA driver")
    if spec.use_nfd_labeling:
        if nfd_rule.NFD_GROUP in view.api_groups:
            objects += nfd_rule.manifests(name)
        else:
            errors.append(NFD_MISSING)
    if (
        spec.resource_monitoring
        and spec.prometheus_integration
        and prometheus.MONITORING_GROUP in view.api_groups
    ):
        objects += prometheus.manifests(ops)
    objects += module.objects
    errors += module.errors

    daemon_sets = {  # column: (DaemonSet, planned)
        COLUMNS[0]: (device_plugin.name(name), spec.resource_registration == "dp"),
        COLUMNS[1]: (dra_driver.name(name), dra_planned or bool(_dra_objects(name, objects))),
        COLUMNS[2]: (xpu_manager.name(name), xpu_planned),
    }
    columns = {c: daemon_set_status(view.owned, *ds) for c, ds in daemon_sets.items()}
    columns[COLUMNS[3]] = module.kmm_status
    unobserved = [
        f"DaemonSet {ds}"
        for ds, planned in daemon_sets.values()
        if planned and not daemon_set_observed(view.owned, ds)
    ]
    if not module.observed:
        unobserved.append(f"Module {module_name(name)}")
    shown = bounded(errors)
    status: dict[str, Any] = {
        **columns,
        "engine": engine,
        "engineSwitch": module.switch or "",
        "errors": shown,
        # Which claims hold a deletion back; the errors say only what is held, word for word.
        "blockingClaims": claims[:MAX_BLOCKING_CLAIMS] if any(BLOCKING in e for e in shown) else [],
        "conditions": conditions(
            old, generation, progress(list(columns.values()), unobserved), shown, datetime.now(UTC)
        ),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return Plan(objects=objects, status=status, requeue_after=module.requeue_after)


COLUMNS = ("devicePluginStatus", "draStatus", "xpuManagerStatus", "kmmStatus")


def with_apply_failures(
    body: Obj, status: Mapping[str, Any], failures: Sequence[ApplyFailure]
) -> dict[str, Any]:
    """The plan's status with what the API server refused (Intel's operator's words):
    a policy whose Module was refused is not Ready, whatever its columns say."""
    meta = body.get("metadata") or {}
    policy = meta.get("name", "")
    refused = [
        f"failed to reconcile {_described(f)} {f.name} for ClusterPolicy {policy}: {f.message}"
        for f in failures
    ]
    errors = bounded([*(status.get("errors") or []), *refused])
    old = body.get("status") or {}
    now = datetime.now(UTC)
    return {
        **status,
        "errors": errors,
        "conditions": conditions(old, meta.get("generation"), progress_of(status), errors, now),
    }


def _described(failure: ApplyFailure) -> str:
    if failure.kind == "Module":
        return "KMM Module" if failure.api_version == KMM_API_VERSION else "Module"
    return failure.kind


def _kernel_module(
    name: str, spec: ClusterPolicySpec, view: ClusterView, claims: list[str]
) -> tuple[ModuleOutcome, str, str | None]:
    """The Module's outcome, the engine serving it, and the readiness label to gate on."""
    km = spec.kernel_module
    if km is None:
        return decide(None, view.owned, claims), "", None
    choice = choose_engine(km, view.api_groups, view.settings)
    problems = [
        f"{p.path}: {p.message}"
        for p in [*name_problems(name, view.operator_namespace), *kernel_module_problems(km)]
    ]
    if choice.api_version is None or problems:
        # A working driver is kept rather than removed over a problem the
        # user is about to fix (or a KMM that is being reinstalled).
        reasons = [*([choice.error] if choice.error else []), *problems]
        outcome = decide(None, view.owned, claims, hold_reason="; ".join(reasons))
    else:
        desired = module_manifest(
            name, spec, view.operator_namespace, choice.api_version, view.settings
        )
        outcome = decide(desired, view.owned, claims)
        if choice.error:
            outcome = ModuleOutcome(
                outcome.objects,
                outcome.kmm_status,
                [choice.error, *outcome.errors],
                outcome.requeue_after,
                outcome.serving,
            )
    engine = outcome.serving or choice.engine or ""
    if choice.engine is None:
        return outcome, engine, None
    try:
        ready = MODULE_READY_LABEL.key(view.operator_namespace, module_name(name))
    except LabelKeyError:
        ready = None
    return outcome, engine, ready


def _dra_objects(policy: str, objects: Sequence[Obj]) -> list[Obj]:
    """The DRA driver's objects among ``objects``."""
    names = {
        dra_driver.name(policy),
        dra_driver.DEVICE_CLASS,
        dra_driver.VFIO_DEVICE_CLASS,
        dra_driver.scc_name(policy),
    }
    kinds = {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DaemonSet",
        "SecurityContextConstraints",
    }
    return [
        o
        for o in objects
        if o.get("kind") in kinds and (o.get("metadata") or {}).get("name") in names
    ]
