"""The ClusterPolicy plan: given a policy and a ClusterView, exactly what it owns and reports."""

from __future__ import annotations

import copy
from typing import Any

from kmodkit.backends import intel_xe
from kmodkit.backends.intel_xe.plan import DRA_DISABLED, NFD_MISSING, plan
from kmodkit.backends.intel_xe.settings import DRA_GROUP
from kmodkit.backends.intel_xe.status import MAX_ERRORS, bounded
from kmodkit.core.api import API_VERSION, KMM_API_VERSION
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.contract.hooks import Obj
from kmodkit.core.engine.module_rules import validate_module
from kmodkit.sdk import HANDED_OVER
from tests.unit.backends.cached import as_cached

NS = "kmodkit-system"
KMM = frozenset({"kmm.sigs.x-k8s.io"})
READY = f"kmm.node.kubernetes.io/{NS}.gpu-policy-gpu.ready"
CLAIM = {
    "metadata": {"namespace": "apps", "name": "inference"},
    "status": {"allocation": {"devices": {"results": [{"driver": "gpu.intel.com"}]}}},
}


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "gpu-policy", "uid": "uid-1", "generation": 3},
        "spec": {"resourceRegistration": "dp", **spec},
    }


def kernel_module(**fields: Any) -> dict[str, Any]:
    return {
        "kernelMappings": [
            {
                "regexp": "^7[.]0[.]0-.*-generic$",
                "containerImage": "reg.local/xe:v1-$KERNEL_FULL_VERSION",
            }
        ],
        **fields,
    }


def view(
    groups: frozenset[str] = frozenset(),
    owned: list[Obj] | None = None,
    claims: list[Obj] | None = None,
    admin_access: bool = True,
    **settings: str,
) -> ClusterView:
    namespaces = [{"metadata": {"name": NS}}] if admin_access else []
    return ClusterView(
        nodes=[],
        # Every supported Kubernetes (1.34+) serves DRA's resource.k8s.io.
        api_groups=groups | {DRA_GROUP},
        operator_namespace=NS,
        watched=as_cached(
            intel_xe.backend,
            {"resourceclaims": claims or [], "admin-access-namespaces": namespaces},
        ),
        owned=owned or [],
        settings=settings,
    )


def objects(p: Any, kind: str) -> list[dict[str, Any]]:
    return [o for o in p.objects if o["kind"] == kind]


def module_of(p: Any) -> dict[str, Any]:
    (module,) = objects(p, "Module")
    return module


def live(module: dict[str, Any], available: int = 0, desired: int = 0, **meta: Any) -> Obj:
    obj = copy.deepcopy(module)
    obj["metadata"].update(meta)
    obj["status"] = {"moduleLoader": {"availableNumber": available, "desiredNumber": desired}}
    return obj


def test_module_mapping_follows_intel_field_for_field() -> None:
    km = kernel_module(
        firmwarePath="/firmware",
        modulesLoadingOrder=["xe", "drm_buddy"],
        version="v1",
        registryTLS={"insecure": True},
    )
    km["kernelMappings"][0].update(
        inTreeModulesToRemove=["xe", "i915", "intel_vsec"],
        registryTLS={"insecureSkipTLSVerify": True},
        build={
            "dockerfileConfigMap": {"name": "xe-build-u26.04"},
            "buildArgs": [{"name": "XE_TAG", "value": "xebr_1"}],
            "secrets": [{"name": "src"}],
        },
    )
    km["kernelMappings"].append({"regexp": "^6[.]8", "containerImage": "reg.local/xe:6.8"})
    p = plan(
        body(
            kernelModule=km,
            useNFDLabeling=True,
            nodeSelector={"pool": "gpu"},
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            pullSecret={"name": "xe-registry"},
        ),
        view(KMM | {"nfd.k8s-sigs.io"}, KMODKIT_INTEL_MODULE_LOADER_SERVICE_ACCOUNT="loader"),
    )
    selector = {
        "kubernetes.io/arch": "amd64",
        "pool": "gpu",
        "intel.feature.node.kubernetes.io/gpu-pci": "true",
    }
    assert module_of(p) == {
        "apiVersion": KMM_API_VERSION,
        "kind": "Module",
        "metadata": {"name": "gpu-policy-gpu", "namespace": NS},
        "spec": {
            "selector": selector,
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "imageRepoSecret": {"name": "xe-registry"},
            "moduleLoader": {
                "serviceAccountName": "loader",
                "container": {
                    "modprobe": {
                        "moduleName": "xe",
                        "firmwarePath": "/firmware",
                        "modulesLoadingOrder": ["xe", "drm_buddy"],
                    },
                    "version": "v1",
                    "inTreeModulesToRemove": ["xe"],
                    "imagePullPolicy": "IfNotPresent",
                    "registryTLS": {"insecure": True, "insecureSkipTLSVerify": False},
                    "kernelMappings": [
                        {
                            "regexp": "^7[.]0[.]0-.*-generic$",
                            "containerImage": "reg.local/xe:v1-$KERNEL_FULL_VERSION",
                            "inTreeModulesToRemove": ["xe", "i915", "intel_vsec"],
                            "registryTLS": {"insecure": False, "insecureSkipTLSVerify": True},
                            "build": {
                                "dockerfileConfigMap": {"name": "xe-build-u26.04"},
                                "buildArgs": [{"name": "XE_TAG", "value": "xebr_1"}],
                                "secrets": [{"name": "src"}],
                                "selector": selector,
                            },
                        },
                        {"regexp": "^6[.]8", "containerImage": "reg.local/xe:6.8"},
                    ],
                },
            },
        },
    }
    assert p.status["engine"] == "KMM"


def test_without_kmm_the_same_module_goes_to_the_builtin_engine() -> None:
    with_kmm = module_of(plan(body(kernelModule=kernel_module()), view(KMM)))
    builtin = module_of(plan(body(kernelModule=kernel_module()), view()))
    assert builtin["apiVersion"] == API_VERSION
    assert builtin["spec"] == with_kmm["spec"]
    # Both bodies pass the Module rules of kmodkit and of KMM.
    assert validate_module(builtin) == []
    assert validate_module(with_kmm) == []


def test_either_engine_can_be_forced() -> None:
    forced = plan(body(kernelModule=kernel_module(engine="Builtin")), view(KMM))
    assert module_of(forced)["apiVersion"] == API_VERSION
    by_setting = plan(body(kernelModule=kernel_module()), view(KMM, KMODKIT_INTEL_ENGINE="builtin"))
    assert module_of(by_setting)["apiVersion"] == API_VERSION
    missing = plan(body(kernelModule=kernel_module(engine="KMM")), view())
    assert objects(missing, "Module") == []
    assert missing.status["errors"] == ["KMM is not installed in the cluster."]
    assert missing.status["kmmStatus"] == "N/A"
    # Without an engine to load it, nothing is gated on the driver.
    (dp,) = objects(missing, "DaemonSet")
    assert READY not in dp["spec"]["template"]["spec"]["nodeSelector"]


def test_status_reads_the_owned_modules_counters() -> None:
    module = module_of(plan(body(kernelModule=kernel_module()), view(KMM)))
    p = plan(body(kernelModule=kernel_module()), view(KMM, owned=[live(module, 1, 3)]))
    assert p.status["kmmStatus"] == "1/3"
    assert p.status["errors"] == [
        "module loader not fully available (1/3) for modules.kmm.sigs.x-k8s.io/gpu-policy-gpu"
    ]
    conditions = {c["type"]: c for c in p.status["conditions"]}
    assert conditions["Progressing"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "True"
    assert conditions["Ready"]["observedGeneration"] == 3
    done = plan(body(kernelModule=kernel_module()), view(KMM, owned=[live(module, 3, 3)]))
    assert (done.status["kmmStatus"], done.status["errors"]) == ("3/3", [])


def test_no_kernel_module_means_no_module_and_no_gating() -> None:
    p = plan(body(), view(KMM))
    assert objects(p, "Module") == []
    assert p.status["kmmStatus"] == "N/A"
    assert p.status["engine"] == ""
    (dp,) = objects(p, "DaemonSet")
    assert dp["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


def test_components_wait_for_the_drivers_ready_label() -> None:
    p = plan(
        body(kernelModule=kernel_module(), resourceMonitoring=True, useNFDLabeling=True),
        view(),
    )
    for ds in objects(p, "DaemonSet"):
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
            "kubernetes.io/arch": "amd64",
            "intel.feature.node.kubernetes.io/gpu": "true",
            READY: "",
        }
    assert READY not in module_of(p)["spec"]["selector"]


def test_removing_the_kernel_module_deletes_the_module() -> None:
    module = module_of(plan(body(kernelModule=kernel_module()), view(KMM)))
    p = plan(body(), view(KMM, owned=[live(module, 2, 2)]))
    assert objects(p, "Module") == []
    assert p.status["kmmStatus"] == "Removing"
    assert p.requeue_after is not None
    terminating = live(module, deletionTimestamp="2026-01-01T00:00:00Z")
    p = plan(body(), view(KMM, owned=[terminating]))
    assert p.status["errors"] == ["modules.kmm.sigs.x-k8s.io/gpu-policy-gpu is pending deletion"]
    assert plan(body(), view(KMM)).status["kmmStatus"] == "N/A"


def test_version_switch_recreates_and_a_bump_patches_in_place() -> None:
    unversioned = module_of(plan(body(kernelModule=kernel_module()), view(KMM)))
    versioned = body(kernelModule=kernel_module(version="v2"))
    p = plan(versioned, view(KMM, owned=[live(unversioned, 2, 2)]))
    assert objects(p, "Module") == []
    assert p.status["kmmStatus"] == "Recreating"
    # Once the old Module is gone the new one is created.
    assert (
        module_of(plan(versioned, view(KMM)))["spec"]["moduleLoader"]["container"]["version"]
        == "v2"
    )
    v1 = module_of(plan(body(kernelModule=kernel_module(version="v1")), view(KMM)))
    bumped = plan(versioned, view(KMM, owned=[live(v1, 2, 2)]))
    assert module_of(bumped)["spec"]["moduleLoader"]["container"]["version"] == "v2"
    assert bumped.status["kmmStatus"] == "2/2"


def test_an_engine_switch_hands_over_without_a_moment_unserved() -> None:
    policy = body(kernelModule=kernel_module())
    builtin = live(module_of(plan(policy, view())), 2, 2)
    kmm = module_of(plan(policy, view(KMM)))

    def step(*owned: Obj) -> Any:
        p = plan(policy, view(KMM, owned=list(owned)))
        return p, {
            (m["apiVersion"], bool(m["metadata"].get("annotations"))) for m in objects(p, "Module")
        }

    # KMM's CRDs appear: its Module is made next to the running one, which stays.
    p, modules = step(builtin)
    assert modules == {(KMM_API_VERSION, False), (API_VERSION, False)}
    assert (p.status["engine"], p.status["kmmStatus"]) == ("Builtin", "2/2")
    assert p.status["engineSwitch"] == (
        "Builtin to KMM: waiting for KMM to load the driver on every node (0/0)"
    )
    # A KMM that never reports (its CRDs without its controller), or reports less
    # than every node: the built-in engine keeps serving.
    for reported in ({k: v for k, v in kmm.items() if k != "status"}, live(kmm, 1, 2)):
        assert step(builtin, reported)[1] == modules
    # KMM has loaded every node: the built-in Module is marked handed over ...
    p, modules = step(builtin, live(kmm, 2, 2))
    assert modules == {(KMM_API_VERSION, False), (API_VERSION, True)}
    handed = next(m for m in objects(p, "Module") if m["apiVersion"] == API_VERSION)
    assert handed["metadata"]["annotations"] == {HANDED_OVER: "true"}
    assert (p.status["engine"], p.status["kmmStatus"]) == ("KMM", "2/2")
    # ... and then goes (its engine leaves the driver loaded).
    marked = copy.deepcopy(builtin)
    marked["metadata"]["annotations"] = {HANDED_OVER: "true"}
    p, modules = step(marked, live(kmm, 2, 2))
    assert modules == {(KMM_API_VERSION, False)}
    assert plan(policy, view(KMM, owned=[live(kmm, 2, 2)])).status["engineSwitch"] == ""


def test_an_ordered_upgrade_no_node_joined_yet_says_how_to_proceed() -> None:
    versioned = body(kernelModule=kernel_module(version="v2"))
    module = live(module_of(plan(versioned, view(KMM))), 0, 0)
    module["status"]["moduleLoader"]["nodesMatchingSelectorNumber"] = 3
    p = plan(versioned, view(KMM, owned=[module]))
    assert p.status["errors"] == [
        "no node is labelled for version v2 of modules.kmm.sigs.x-k8s.io/gpu-policy-gpu yet; "
        "label the nodes to move to it: kubectl label node <node> "
        f"kmm.node.kubernetes.io/version-module.{NS}.gpu-policy-gpu=v2"
    ]
    ready = next(c for c in p.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    # No version, or no node selected at all: nothing to say.
    module["status"]["moduleLoader"]["nodesMatchingSelectorNumber"] = 0
    assert plan(versioned, view(KMM, owned=[module])).status["errors"] == []


def test_allocated_gpu_claims_hold_the_module() -> None:
    module = live(module_of(plan(body(kernelModule=kernel_module()), view(KMM))), 2, 2)
    other_driver = {
        "metadata": {"namespace": "a", "name": "nic"},
        "status": {"allocation": {"devices": {"results": [{"driver": "nic.example.com"}]}}},
    }
    removal = plan(body(), view(KMM, owned=[module], claims=[CLAIM]))
    (kept,) = objects(removal, "Module")
    assert kept["spec"] == module["spec"] and "status" not in kept
    assert removal.status["kmmStatus"] == "2/2"
    # The documented message word for word; which claims, in a field of their own.
    assert removal.status["errors"] == [
        "allocated GPU ResourceClaims blocking modules.kmm.sigs.x-k8s.io/gpu-policy-gpu deletion"
    ]
    assert removal.status["blockingClaims"] == ["apps/inference"]
    toggle = plan(
        body(kernelModule=kernel_module(version="v2")), view(KMM, owned=[module], claims=[CLAIM])
    )
    assert objects(toggle, "Module")[0]["spec"] == module["spec"]
    assert "recreation for version change" in toggle.status["errors"][0]
    # Switching to the built-in engine: KMM's Module goes (and KMM unloads) only once
    # the built-in one serves every node, and not while a claim is allocated.
    to_builtin = body(kernelModule=kernel_module(engine="Builtin"))
    waiting = plan(to_builtin, view(KMM, [module], [CLAIM]))
    assert {m["apiVersion"] for m in objects(waiting, "Module")} == {KMM_API_VERSION, API_VERSION}
    assert waiting.status["errors"] == []
    builtin = live(module_of(plan(to_builtin, view())), 2, 2)
    switch = plan(to_builtin, view(KMM, [module, builtin], [CLAIM]))
    assert {m["apiVersion"] for m in objects(switch, "Module")} == {KMM_API_VERSION, API_VERSION}
    assert switch.status["errors"] == [
        "allocated GPU ResourceClaims blocking modules.kmm.sigs.x-k8s.io/gpu-policy-gpu "
        "deletion for the switch to Builtin"
    ]
    released_switch = plan(to_builtin, view(KMM, [module, builtin]))
    assert [m["apiVersion"] for m in objects(released_switch, "Module")] == [API_VERSION]
    # Claims of other drivers do not count; once the GPU claims go, removal proceeds.
    released = plan(body(), view(KMM, owned=[module], claims=[other_driver]))
    assert objects(released, "Module") == []
    assert released.status["kmmStatus"] == "Removing"
    assert released.status["blockingClaims"] == []


def test_amd64_is_always_required_and_another_arch_is_reported() -> None:
    p = plan(
        body(
            kernelModule=kernel_module(),
            nodeSelector={"kubernetes.io/arch": "arm64", "pool": "gpu"},
        ),
        view(KMM),
    )
    assert module_of(p)["spec"]["selector"] == {"kubernetes.io/arch": "amd64", "pool": "gpu"}
    dp = next(o for o in p.objects if o["kind"] == "DaemonSet")
    assert dp["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/arch"] == "amd64"
    assert p.status["errors"][0] == (
        "spec.nodeSelector: kubernetes.io/arch=arm64 conflicts with kubernetes.io/arch: amd64, "
        "which is always required (the Intel GPU components and driver are built for amd64); "
        "remove it or set it to amd64"
    )
    same = plan(body(nodeSelector={"kubernetes.io/arch": "amd64"}), view(KMM))
    assert same.status["errors"] == []


def test_invalid_kernel_module_keeps_the_running_module() -> None:
    module = live(module_of(plan(body(kernelModule=kernel_module()), view(KMM))), 1, 1)
    km = kernel_module()
    km["kernelMappings"][0]["regexp"] = "(?=7)"
    p = plan(body(kernelModule=km), view(KMM, owned=[module]))
    assert objects(p, "Module")[0]["spec"] == module["spec"]
    assert "spec.kernelModule.kernelMappings[0].regexp" in p.status["errors"][0]


def test_device_plugin_daemonset() -> None:
    p = plan(
        body(
            resourceMonitoring=True,
            logLevel=1,
            dp={"logLevel": 3, "byPathMode": "single", "allowIDs": ["0xe20b", "0xe20c"]},
            pullSecret={"name": "reg"},
        ),
        view(),
    )
    (dp,) = [
        d for d in objects(p, "DaemonSet") if d["metadata"]["name"] == "gpu-policy-device-plugin"
    ]
    pod = dp["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "-enable-monitoring",
        "-xpumd-endpoint=/run/xpumd/intelxpuinfo.sock",
        "-v=3",
        "-bypath=single",
        "-allow-ids=0xe20b,0xe20c",
    ]
    assert container["image"].startswith("docker.io/intel/intel-gpu-plugin:0.36.0@sha256:")
    assert pod["imagePullSecrets"] == [{"name": "reg"}]
    assert {v["name"] for v in pod["volumes"]} >= {"devfs", "runxpumd"}
    assert dp["metadata"]["labels"] == {"app": "intel-gpu-plugin", "owner": "gpu-policy"}
    assert p.status["devicePluginStatus"] == "0/0"
    assert p.status["draStatus"] == "N/A"


def test_image_settings_and_policy_images() -> None:
    p = plan(body(), view(KMODKIT_INTEL_DEVICE_PLUGIN_IMAGE="mirror.local/gpu-plugin:0.36.0"))
    assert objects(p, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "mirror.local/gpu-plugin:0.36.0"
    )
    p = plan(
        body(dp={"plugin": "mine.local/plugin:1"}), view(KMODKIT_INTEL_DEVICE_PLUGIN_IMAGE="x:1")
    )
    assert objects(p, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "mine.local/plugin:1"
    )


def test_dra_mode_objects() -> None:
    p = plan(
        body(
            resourceRegistration="dra",
            health={},
            dra={"podHealthCheck": False},
            resourceMonitoring=True,
        ),
        view(),
    )
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in p.objects)
    assert kinds == [
        ("ClusterRole", "gpu-policy-gpu-dra"),
        ("ClusterRoleBinding", "gpu-policy-gpu-dra"),
        ("ConfigMap", "gpu-policy-xpumanager-otel-config"),
        ("DaemonSet", "gpu-policy-gpu-dra"),
        ("DaemonSet", "gpu-policy-xpu-manager"),
        ("DeviceClass", "gpu-vfio.intel.com"),
        ("DeviceClass", "gpu.intel.com"),
        ("ResourceClaimTemplate", "gpu-policy-monitor-claim"),
        ("ServiceAccount", "gpu-policy-gpu-dra"),
        ("ValidatingAdmissionPolicy", "gpu-policy-gpu-dra"),
        ("ValidatingAdmissionPolicyBinding", "gpu-policy-gpu-dra"),
    ]
    dra = next(
        o
        for o in p.objects
        if o["metadata"]["name"] == "gpu-policy-gpu-dra" and o["kind"] == "DaemonSet"
    )
    (container,) = dra["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "-v=0",
        "--health-monitoring=true",
        "--healthcheck-port=-1",
        "--manage-binding=false",
    ]
    assert "livenessProbe" not in container
    vfio = next(o for o in p.objects if o["metadata"]["name"] == "gpu-vfio.intel.com")
    assert len(vfio["spec"]["selectors"]) == 2
    xpu = next(o for o in p.objects if o["metadata"]["name"] == "gpu-policy-xpu-manager")
    assert xpu["spec"]["template"]["spec"]["resourceClaims"] == [
        {"name": "monitor-claim", "resourceClaimTemplateName": "gpu-policy-monitor-claim"}
    ]
    assert (
        "gpu.intel.com/xpum-otel-config-hash" in xpu["spec"]["template"]["metadata"]["annotations"]
    )
    assert p.status["devicePluginStatus"] == "N/A"


def test_xpu_manager_in_dra_mode_needs_admin_access_on_the_namespace() -> None:
    p = plan(body(resourceRegistration="dra", resourceMonitoring=True), view(admin_access=False))
    assert not [o for o in p.objects if o["metadata"]["name"].startswith("gpu-policy-xpu")]
    assert p.status["xpuManagerStatus"] == "N/A"
    assert "resource.kubernetes.io/admin-access=true" in p.status["errors"][0]
    dp_mode = plan(body(resourceMonitoring=True), view(admin_access=False))
    assert dp_mode.status["errors"] == []


def test_xpu_manager_in_dp_mode_requests_the_monitoring_resource() -> None:
    p = plan(body(resourceMonitoring=True, xpu={"monitoringResource": "xe_monitoring"}), view())
    xpu = next(o for o in p.objects if o["metadata"]["name"] == "gpu-policy-xpu-manager")
    resources = xpu["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["gpu.intel.com/xe_monitoring"] == "1"
    assert "resourceClaims" not in xpu["spec"]["template"]["spec"]


def test_dra_removal_waits_for_claims() -> None:
    dra = plan(body(resourceRegistration="dra"), view())
    owned = [{**o, "status": {"numberReady": 1, "desiredNumberScheduled": 1}} for o in dra.objects]
    p = plan(body(), view(owned=owned, claims=[CLAIM]))
    held = {(o["kind"], o["metadata"]["name"]) for o in p.objects}
    assert ("DaemonSet", "gpu-policy-gpu-dra") in held
    assert ("DeviceClass", "gpu.intel.com") in held
    assert p.status["draStatus"] == "1/1"
    assert "blocking removal of the DRA driver" in p.status["errors"][0]
    assert {o["kind"] for o in plan(body(), view(owned=owned)).objects} == {"DaemonSet"}


def test_dra_disabled_and_nfd_missing_are_reported() -> None:
    p = plan(
        body(resourceRegistration="dra", useNFDLabeling=True), view(KMODKIT_INTEL_DRA="disabled")
    )
    assert p.status["errors"] == [DRA_DISABLED, NFD_MISSING]
    assert p.status["draStatus"] == "N/A"
    with_nfd = plan(body(useNFDLabeling=True), view(frozenset({"nfd.k8s-sigs.io"})))
    (rule,) = objects(with_nfd, "NodeFeatureRule")
    labels = [label for r in rule["spec"]["rules"] for label in r["labels"]]
    assert "intel.feature.node.kubernetes.io/gpu-pci" in labels
    assert "intel.feature.node.kubernetes.io/gpu" in labels


def test_prometheus_objects_only_where_the_operator_is_served() -> None:
    spec = {"resourceMonitoring": True, "prometheusIntegration": True}
    assert objects(plan(body(**spec), view()), "ServiceMonitor") == []
    served = plan(body(**spec), view(frozenset({"monitoring.coreos.com"})))
    assert len(objects(served, "ServiceMonitor")) == len(objects(served, "Service")) == 1


def test_daemonset_status_counts() -> None:
    first = plan(body(), view())
    (dp,) = objects(first, "DaemonSet")
    owned = [{**dp, "status": {"numberReady": 2, "desiredNumberScheduled": 3}}]
    assert plan(body(), view(owned=owned)).status["devicePluginStatus"] == "2/3"


def counted(daemon_set: dict[str, Any], generation: int, seen: int, ready: int = 1) -> Obj:
    """``daemon_set`` at ``generation``, its controller's status from ``seen``."""
    status = {"observedGeneration": seen, "numberReady": ready, "desiredNumberScheduled": 1}
    meta = {**daemon_set["metadata"], "generation": generation}
    return {**daemon_set, "metadata": meta, "status": status}


def test_ready_only_once_every_component_has_reported() -> None:
    """A Module or DaemonSet just created shows 0/0 until its controller counts it: that says
    nothing about the nodes, so the policy is not Ready before each has reported."""
    policy = body(kernelModule=kernel_module())
    first = plan(policy, view(KMM))
    module, (dp,) = module_of(first), objects(first, "DaemonSet")
    waiting = "waiting for the first status of"
    ds, mod = f"DaemonSet {dp['metadata']['name']}", f"Module {module['metadata']['name']}"

    def condition(*owned: Obj) -> tuple[str, str]:
        status = plan(policy, view(KMM, owned=list(owned))).status
        c = {c["type"]: c for c in status["conditions"]}
        assert c["Ready"]["status"] == ("False" if c["Progressing"]["status"] == "True" else "True")
        return c["Ready"]["status"], c["Progressing"]["message"]

    assert condition() == ("False", f"{waiting} {ds}, {mod}")
    assert condition(counted(dp, 1, 1), module) == ("False", f"{waiting} {mod}")
    assert condition(counted(dp, 2, 1), live(module, 1, 1)) == ("False", f"{waiting} {ds}")
    assert condition(counted(dp, 2, 2), live(module, 0, 1)) == (
        "False",
        "components are rolling out",
    )
    assert condition(counted(dp, 2, 2), live(module, 1, 1)) == ("True", "nothing in progress")


def test_status_is_stable_once_converged() -> None:
    first = plan(body(), view())
    again = plan({**body(), "status": first.status}, view())
    assert again.status == first.status


def test_errors_are_deduplicated_and_bounded() -> None:
    errors = [f"e{i}" for i in range(15)] + ["e1"]
    shown = bounded(errors)
    assert len(shown) == MAX_ERRORS
    assert shown[-1] == "6 more errors not shown"
    assert bounded(["a", "a", "b"]) == ["a", "b"]


OPENSHIFT = frozenset({"security.openshift.io"})


def _scc(p: Any, name: str) -> tuple[dict[str, Any], list[str]]:
    """An SCC of the plan and the users it lets use it."""
    (scc,) = [o for o in objects(p, "SecurityContextConstraints") if o["metadata"]["name"] == name]
    return scc, list(scc["users"])


def _pod(p: Any, daemon_set: str) -> dict[str, Any]:
    (ds,) = [o for o in objects(p, "DaemonSet") if o["metadata"]["name"] == daemon_set]
    return dict(ds["spec"]["template"]["spec"])


def test_on_openshift_each_component_gets_its_own_scc_and_account() -> None:
    p = plan(body(resourceMonitoring=True), view(OPENSHIFT))
    scc, users = _scc(p, "gpu-policy-gpu-dp-scc")
    assert users == [f"system:serviceaccount:{NS}:gpu-policy-gpu-dp-sa"]
    assert (scc["allowPrivilegedContainer"], scc["allowHostDirVolumePlugin"]) == (False, True)
    assert scc["requiredDropCapabilities"] == ["ALL"] and scc["volumes"] == ["hostPath", "emptyDir"]
    assert _pod(p, "gpu-policy-device-plugin")["serviceAccountName"] == "gpu-policy-gpu-dp-sa"
    scc, users = _scc(p, "gpu-policy-xpu-manager-scc")
    assert users == [f"system:serviceaccount:{NS}:gpu-policy-xpu-manager-sa"]
    assert scc["allowedCapabilities"] == ["SYS_ADMIN"]
    xpu = _pod(p, "gpu-policy-xpu-manager")
    assert xpu["serviceAccountName"] == "gpu-policy-xpu-manager-sa"
    assert xpu["containers"][0]["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    accounts = {o["metadata"]["name"] for o in objects(p, "ServiceAccount")}
    assert {"gpu-policy-gpu-dp-sa", "gpu-policy-xpu-manager-sa"} <= accounts

    dra = plan(body(resourceRegistration="dra"), view(OPENSHIFT))
    scc, users = _scc(dra, "gpu-policy-gpu-dra-scc")
    assert users == [f"system:serviceaccount:{NS}:gpu-policy-gpu-dra"]
    assert scc["volumes"] == ["hostPath", "projected"]
    # Held with the DRA driver while a GPU claim is allocated.
    owned = [{**o, "status": {}} for o in dra.objects]
    held = plan(body(), view(OPENSHIFT, owned=owned, claims=[CLAIM]))
    kept = {o["metadata"]["name"] for o in objects(held, "SecurityContextConstraints")}
    assert kept == {"gpu-policy-gpu-dp-scc", "gpu-policy-gpu-dra-scc"}
    # Elsewhere there is no SCC, and the pods keep their accounts.
    plain = plan(body(resourceMonitoring=True), view())
    assert objects(plain, "SecurityContextConstraints") == []
    assert "serviceAccountName" not in _pod(plain, "gpu-policy-device-plugin")
