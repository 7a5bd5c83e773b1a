"""The module-loader planner: which pods, which labels, within which budget."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.api import Module
from kmodkit.core.api.common import Toleration
from kmodkit.core.engine.kernel_mapping import resolve
from kmodkit.core.engine.loader_plan import (
    Context,
    ImageState,
    ImageStatus,
    LoaderPlan,
    NeededImages,
    NodeStep,
    Phase,
    Update,
    decide,
    gated_on,
    labels_follow_pods,
    max_unavailable,
    plan,
)
from kmodkit.core.engine.loader_pod import (
    AGENT_CONFIG,
    COMPONENT_LABEL,
    CONFIG_HASH,
    MODULE_HASH,
    LoaderPod,
    LoaderSettings,
    loader_pod,
    loader_pod_view,
)
from kmodkit.core.nodes import NodeView, Taint

NS, NAME = "drivers", "xe"
READY = f"kmm.node.kubernetes.io/{NS}.{NAME}.ready"
VREADY = f"kmm.node.kubernetes.io/{NS}.{NAME}.version.ready"
WANT = f"kmm.node.kubernetes.io/version-module.{NS}.{NAME}"
K1, K2 = "6.8.0-45-generic", "7.0.0-14-generic"
SETTINGS = LoaderSettings(agent_image="registry.example.com/kmodkit/agent:1")


def module(**container: Any) -> Module:
    rollout = container.pop("rollout", None)
    body: dict[str, Any] = {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "selector": {"gpu": "intel"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "kernelMappings": [
                        {"regexp": r"^6\.8\.", "containerImage": "r.io/xe:${KERNEL_FULL_VERSION}"},
                        {"literal": K2, "containerImage": "r.io/xe:${KERNEL_FULL_VERSION}"},
                    ],
                    **container,
                }
            },
        },
    }
    if rollout:
        body["spec"]["rollout"] = rollout
    return Module.model_validate(body)


def node(name: str, kernel: str = K1, **labels: str) -> NodeView:
    return NodeView(
        name=name, labels={"gpu": "intel", **labels}, kernel=kernel, arch="amd64", ready=True
    )


def all_exist(m: Module, nodes: list[NodeView]) -> dict[str, ImageStatus]:
    first = plan(m, nodes, [], {}, SETTINGS)
    return {i: ImageStatus(ImageState.EXISTS) for i in first.needed_images}


def running(
    m: Module, n: NodeView, ready: bool = True, version: str = "", **observed: Any
) -> LoaderPod:
    """The loader pod the engine makes for ``m`` on ``n``, as the cache sees it running."""
    resolved = resolve(m, n.kernel)
    assert not isinstance(resolved, type(None))
    pod = loader_pod(m, n, resolved, SETTINGS)  # type: ignore[arg-type]
    pod["metadata"] |= {"uid": f"uid-{pod['metadata']['name']}", "creationTimestamp": "t1"}
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    view = loader_pod_view(pod)
    return replace(view, version=version or view.version, **observed)


def legacy(name: str, node_name: str, kernel: str = K1, ready: bool = True) -> LoaderPod:
    """A loader pod made before pods recorded their module: it unloads on SIGTERM."""
    return LoaderPod(name, node_name, "h", kernel, "", ready, uid=f"uid-{name}")


def outcome(p: LoaderPlan, name: str) -> Any:
    return next(o for o in p.outcomes if o.node == name)


def test_first_load_creates_one_pod_per_selected_node_with_the_resolved_image() -> None:
    m = module()
    nodes = [node("a"), node("b", K2), NodeView("other", {"gpu": "amd"}, K1)]
    p = plan(m, nodes, [], all_exist(m, nodes), SETTINGS)
    pods = {pod["spec"]["nodeName"]: pod for pod in p.create}
    assert sorted(pods) == ["a", "b"]
    assert pods["b"]["spec"]["initContainers"][0]["image"] == f"r.io/xe:{K2}"
    # No shell: the mapping's paths and the kernel string are arguments, never parsed.
    assert pods["b"]["spec"]["initContainers"][0]["command"] == [
        "cp",
        "-R",
        "/opt/lib/modules/7.0.0-14-generic/.",
        "/staging/",
    ]
    assert not p.node_labels  # nothing is ready yet, nothing to label


def test_a_pod_on_a_node_the_plan_does_not_see_is_left_alone() -> None:
    # An operator start or failover plans on a node cache that is still filling:
    # nodes missing from it must not lose their driver.
    m = module()
    seen, unseen = node("a"), node("b")
    pods = [running(m, seen), running(m, unseen)]
    p = plan(m, [seen], pods, all_exist(m, [seen, unseen]), SETTINGS)
    assert p.delete == [] and p.create == []
    assert "b" not in p.node_labels
    assert [o.node for o in p.outcomes] == ["a"]


def test_ready_label_follows_the_loader_pod_readiness() -> None:
    m = module()
    a, b = node("a"), node("b", **{READY: ""})
    p = plan(m, [a, b], [running(m, a), running(m, b, ready=False)], all_exist(m, [a, b]), SETTINGS)
    assert p.node_labels == {"a": {READY: ""}, "b": {READY: None}}
    assert outcome(p, "a").phase is Phase.LOADED


def test_no_mapping_is_reported_by_node_and_unloads_what_ran_there() -> None:
    m = module()
    n = node("rhel", "5.14.0-427.el9.x86_64", **{READY: ""})
    p = plan(m, [n], [LoaderPod("old", "rhel", "h", n.kernel, "", True)], {}, SETTINGS)
    o = outcome(p, "rhel")
    assert (o.phase, o.reason) == (Phase.UNMAPPED, "NoMapping")
    assert "5.14.0-427.el9.x86_64" in o.message
    # The label goes first; the module once nothing gated on it is left.
    assert p.delete == [] and p.node_labels == {"rhel": {READY: None}}
    unlabelled = node("rhel", "5.14.0-427.el9.x86_64")
    pod = LoaderPod("old", "rhel", "h", unlabelled.kernel, "", True)
    assert plan(m, [unlabelled], [pod], {}, SETTINGS).awaiting_consumers == ["rhel"]
    p = plan(m, [unlabelled], [pod], {}, SETTINGS, {"rhel": []})
    assert p.delete == ["old"]


def test_missing_image_without_build_is_a_failure_that_keeps_the_old_module() -> None:
    m = module()
    n = node("a", **{READY: ""})
    old = LoaderPod("old", "a", "stale-hash", K1, "", True)
    p = plan(m, [n], [old], {f"r.io/xe:{K1}": ImageStatus(ImageState.MISSING)}, SETTINGS)
    assert outcome(p, "a").reason == "ImageMissing"
    assert not p.delete and not p.create and not p.node_labels


def test_spec_change_reloads_within_max_unavailable() -> None:
    m_old = module()
    nodes = [node(n, **{READY: ""}) for n in "abcd"]
    pods = [running(m_old, n) for n in nodes]
    m_new = module(
        modprobe={"moduleName": "xe", "parameters": ["debug=1"]}, rollout={"maxUnavailable": 2}
    )
    p = plan(m_new, nodes, pods, all_exist(m_new, nodes), SETTINGS)
    started = [n for n, c in p.node_labels.items() if c.get(READY, "") is None]
    assert len(started) == 2  # the budget
    assert not p.delete  # the label goes first; pods are deleted on a later pass
    assert sorted(o.reason for o in p.outcomes) == [
        "UpdatePending",
        "UpdatePending",
        "WaitingForConsumers",
        "WaitingForConsumers",
    ]


def test_unload_waits_for_pods_gated_on_the_ready_label() -> None:
    m_old = module()
    n = node("a")  # label already removed by the previous pass
    pods = [running(m_old, n)]
    m_new = module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    p = plan(m_new, [n], pods, all_exist(m_new, [n]), SETTINGS)
    assert p.awaiting_consumers == ["a"] and not p.delete
    p = plan(m_new, [n], pods, all_exist(m_new, [n]), SETTINGS, {"a": ["kube-system/dp-x"]})
    assert not p.delete and "kube-system/dp-x" in outcome(p, "a").message
    assert p.held == {"a": ("kube-system/dp-x",)}
    p = plan(m_new, [n], pods, all_exist(m_new, [n]), SETTINGS, {"a": []})
    assert p.held == {}
    assert p.delete == [pods[0].name]


def test_version_gating_loads_only_labelled_nodes_and_keeps_old_versions() -> None:
    v1 = module(version="v1")
    nodes = [
        node("a", **{WANT: "v1", READY: "", VREADY: "v1"}),
        node("b", **{WANT: "v1", READY: "", VREADY: "v1"}),
        node("c"),
    ]
    pods = [running(v1, nodes[0]), running(v1, nodes[1])]
    v2 = module(version="v2", containerImage=None)
    # Admin labels only node a with v2.
    nodes[0] = node("a", **{WANT: "v2", READY: "", VREADY: "v1"})
    p = plan(v2, nodes, pods, all_exist(v2, nodes), SETTINGS)
    assert outcome(p, "b").reason == "AwaitingVersionLabel"
    assert "version 'v1' stays loaded" in outcome(p, "b").message
    assert outcome(p, "c").reason == "AwaitingVersionLabel"
    assert p.node_labels == {"a": {READY: None, VREADY: None}}
    assert not p.create


def test_version_ready_label_reports_the_loaded_version() -> None:
    m = module(version="v2")
    n = node("a", **{WANT: "v2"})
    p = plan(m, [n], [running(m, n)], all_exist(m, [n]), SETTINGS)
    assert p.node_labels == {"a": {READY: "", VREADY: "v2"}}


def test_cordon_does_not_unload_but_a_foreign_taint_does() -> None:
    m = module()
    cordoned = NodeView(
        "a",
        {"gpu": "intel", READY: ""},
        K1,
        "amd64",
        True,
        True,
        taints=(Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),),
    )
    tainted = NodeView(
        "b",
        {"gpu": "intel", READY: ""},
        K1,
        "amd64",
        True,
        taints=(Taint("dedicated", "ml", "NoSchedule"),),
    )
    pods = [running(m, cordoned), running(m, tainted)]
    p = plan(m, [cordoned, tainted], pods, all_exist(m, [cordoned, tainted]), SETTINGS)
    assert p.delete == [] and p.node_labels == {"b": {READY: None}}
    assert outcome(p, "a").phase is Phase.LOADED
    tainted = replace(tainted, labels={"gpu": "intel"})
    p = plan(m, [cordoned, tainted], pods, all_exist(m, [cordoned, tainted]), SETTINGS, {"b": []})
    assert p.delete == [pods[1].name]


def test_rebooted_into_another_kernel_replaces_the_pod_without_budget() -> None:
    m = module()
    n = node("a", K2, **{READY: ""})
    stale = LoaderPod("p", "a", "h", K1, "", True)
    p = plan(m, [n], [stale], all_exist(m, [n]), SETTINGS)
    assert p.delete == ["p"] and p.node_labels == {"a": {READY: None}}


def test_raw_args_run_as_given_in_the_staging_directory_and_name_the_module_to_verify() -> None:
    m = module(
        modprobe={"rawArgs": {"load": ["-v", "-d", "/opt", "xe", "guc=3"], "unload": ["-r", "xe"]}}
    )
    pod = loader_pod(m, node("a"), resolve(m, K1), SETTINGS)  # type: ignore[arg-type]
    config = yaml.safe_load(pod["metadata"]["annotations"][AGENT_CONFIG])["modprobe"]
    assert config["moduleName"] == "xe"
    assert config["rawArgs"] == {
        "load": ["-v", "-d", "/kmod/opt", "xe", "guc=3"],
        "unload": ["-d", "/kmod/opt", "-r", "xe"],
    }
    elsewhere = module(modprobe={"rawArgs": {"load": ["-d", "/usr", "xe"], "unload": ["-r", "xe"]}})
    p = plan(elsewhere, [node("a")], [], all_exist(elsewhere, [node("a")]), SETTINGS)
    assert outcome(p, "a").reason == "InvalidAgentConfig"
    assert "rawArgs.load: -d /usr" in outcome(p, "a").message and not p.create


def test_firmware_makes_the_agent_privileged_only_outside_builtin_search_dirs() -> None:
    m = module(modprobe={"moduleName": "xe", "firmwarePath": "/firmware"})
    n = node("a")
    resolved = resolve(m, K1)
    pod = loader_pod(m, n, resolved, SETTINGS)  # type: ignore[arg-type]
    assert pod["spec"]["containers"][0]["securityContext"] == {"privileged": True}
    builtin = LoaderSettings(agent_image="x/a:1", firmware_host_path="/lib/firmware/updates")
    pod = loader_pod(m, n, resolved, builtin)  # type: ignore[arg-type]
    sec = pod["spec"]["containers"][0]["securityContext"]
    assert sec["capabilities"] == {"add": ["SYS_MODULE"], "drop": ["ALL"]}
    plain = loader_pod(module(), n, resolve(module(), K1), SETTINGS)  # type: ignore[arg-type]
    assert "privileged" not in plain["spec"]["containers"][0]["securityContext"]


def test_gated_on_reads_node_selector_and_required_affinity() -> None:
    assert gated_on({"spec": {"nodeSelector": {READY: ""}}}, READY)
    assert gated_on(
        {
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": READY, "operator": "Exists"}]}
                            ]
                        }
                    }
                }
            }
        },
        READY,
    )
    assert not gated_on(
        {"spec": {"nodeSelector": {READY: ""}}, "status": {"phase": "Failed"}}, READY
    )
    assert not gated_on({"spec": {}}, READY)


def test_percent_budget_rounds_down_but_never_below_one() -> None:
    assert max_unavailable("10%", 25) == 2
    assert max_unavailable("10%", 5) == 1
    assert max_unavailable(3, 100) == 3


@settings(max_examples=60, deadline=None)
@given(
    n_nodes=st.integers(1, 12),
    budget=st.integers(1, 5),
    ready_mask=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_a_plan_never_disrupts_more_ready_nodes_than_the_budget(
    n_nodes: int, budget: int, ready_mask: list[bool]
) -> None:
    old = module()
    nodes = [node(f"n{i}", **({READY: ""} if ready_mask[i] else {})) for i in range(n_nodes)]
    pods = [running(old, n, ready=ready_mask[i]) for i, n in enumerate(nodes)]
    new = module(
        modprobe={"moduleName": "xe", "parameters": ["x=1"]}, rollout={"maxUnavailable": budget}
    )
    p = plan(new, nodes, pods, all_exist(new, nodes), SETTINGS)
    newly_unlabelled = [
        n
        for n, c in p.node_labels.items()
        if READY in c and c[READY] is None and READY in next(x.labels for x in nodes if x.name == n)
    ]
    not_ready_before = sum(1 for r in ready_mask[:n_nodes] if not r)
    assert len(newly_unlabelled) <= max(0, budget - not_ready_before)
    # Applying the same plan again to the same observation yields the same plan.
    again = plan(new, nodes, pods, all_exist(new, nodes), SETTINGS)
    assert (again.create, again.delete, again.node_labels) == (p.create, p.delete, p.node_labels)


def test_only_a_working_pod_with_an_outdated_config_waits_for_the_budget() -> None:
    old, new = module(), module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    n = node("a", **{READY: ""})
    ctx = Context.of(new, all_exist(new, [n]), SETTINGS)
    assert isinstance(decide(n, [running(old, n)], ctx), Update)
    broken = decide(n, [running(old, n, ready=False)], ctx)
    assert isinstance(broken, NodeStep)
    assert broken.delete == (running(old, n).name,) and broken.labels == {READY: None}
    assert broken.outcome is not None and broken.outcome.reason == "Replacing"


def test_a_node_held_back_by_its_version_label_keeps_only_a_pod_on_its_kernel() -> None:
    v1, v2 = module(version="v1"), module(version="v2")
    here = node("a", **{WANT: "v1", READY: "", VREADY: "v1"})
    ctx = Context.of(v2, all_exist(v2, [here]), SETTINGS)
    kept = decide(here, [running(v1, here)], ctx)
    assert isinstance(kept, NodeStep)
    assert (kept.delete, kept.labels) == ((), {})
    assert kept.outcome is not None and kept.outcome.reason == "AwaitingVersionLabel"
    rebooted = node("a", K2, **{WANT: "v1", READY: "", VREADY: "v1"})
    gone = decide(rebooted, [running(v1, here)], ctx)
    assert isinstance(gone, NodeStep)
    assert (gone.delete, gone.labels) == ((), {READY: None, VREADY: None})
    unlabelled = node("a", K2, **{WANT: "v1"})
    ctx = Context.of(v2, all_exist(v2, [here]), SETTINGS, {"a": []})
    gone = decide(unlabelled, [running(v1, here)], ctx)
    assert isinstance(gone, NodeStep) and gone.delete == (running(v1, here).name,)


def test_a_retired_node_keeps_its_module_while_pods_gated_on_its_labels_remain() -> None:
    # The selector no longer matches: like an update, the labels go first and the
    # module stays until the device plugin (gated on either label) has left.
    m = module()
    labelled = node("a", **{READY: "", VREADY: ""})
    pod = running(m, labelled)
    out = replace(labelled, labels={"gpu": "amd", READY: "", VREADY: ""})
    p = plan(m, [out], [pod], {}, SETTINGS)
    assert p.delete == [] and p.node_labels == {"a": {READY: None, VREADY: None}}
    assert p.awaiting_consumers == []
    gone_labels = replace(labelled, labels={"gpu": "amd"})
    p = plan(m, [gone_labels], [pod], {}, SETTINGS)
    assert p.delete == [] and p.awaiting_consumers == ["a"]
    p = plan(m, [gone_labels], [pod], {}, SETTINGS, {"a": ["kube-system/xe-device-plugin"]})
    assert p.delete == [] and p.awaiting_consumers == []
    assert p.held == {"a": ("kube-system/xe-device-plugin",)}
    p = plan(m, [gone_labels], [pod], {}, SETTINGS, {"a": []})
    assert p.delete == [pod.name]


def test_an_invalid_mapping_leaves_the_node_and_its_pod_alone() -> None:
    bad = module(kernelMappings=[{"literal": K1, "containerImage": "r.io/xe:${NOPE}"}])
    n = node("a", **{READY: ""})
    step = decide(n, [running(module(), n)], Context.of(bad, {}, SETTINGS))
    assert isinstance(step, NodeStep)
    assert (step.delete, step.create, step.labels, step.image) == ((), None, {}, None)
    assert step.outcome is not None and step.outcome.reason == "InvalidMapping"


def test_an_update_under_way_goes_on_before_a_new_one_takes_the_budget() -> None:
    old = module()
    new = module(
        modprobe={"moduleName": "xe", "parameters": ["debug=1"]}, rollout={"maxUnavailable": 1}
    )
    fresh, under_way = node("a", **{READY: ""}), node("z")  # z lost its label last pass
    pods = [running(old, fresh), running(old, under_way)]
    p = plan(new, [fresh, under_way], pods, all_exist(new, [fresh, under_way]), SETTINGS)
    assert outcome(p, "a").reason == "UpdatePending"
    assert outcome(p, "z").reason == "WaitingForConsumers"
    assert p.awaiting_consumers == ["z"] and "a" not in p.node_labels


def _unloader_of(p: LoaderPlan) -> dict[str, Any]:
    (pod,) = [c for c in p.create if c["metadata"]["labels"][COMPONENT_LABEL] == "module-unloader"]
    return pod


def _observed(pod: dict[str, Any], phase: str = "Running", **status: Any) -> LoaderPod:
    pod["metadata"] |= {"uid": f"uid-{pod['metadata']['name']}", "creationTimestamp": "t2"}
    pod["status"] = {"phase": phase, **status}
    return loader_pod_view(pod)


def test_a_retired_node_is_unloaded_by_an_unloader_made_before_its_loader_goes() -> None:
    m = module()
    gone = node("a", **{"gpu": "amd"})
    loader = running(m, node("a"))
    p = plan(m, [gone], [loader], {}, SETTINGS, {"a": []})
    unloader = _unloader_of(p)
    assert p.delete == [loader.name]
    assert unloader["spec"]["nodeName"] == "a"
    assert unloader["spec"]["containers"][0]["command"][-2:] == ["unload", "--host-managed-ok"]
    assert unloader["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert unloader["metadata"]["annotations"][AGENT_CONFIG] == loader.agent_config

    # While it runs, it is the node's record: nothing is made or deleted.
    running_unloader = _observed(unloader)
    p = plan(m, [gone], [running_unloader], {}, SETTINGS, {"a": []})
    assert (p.create, p.delete, p.outcomes) == ([], [], [])
    # A failing unload is reported, naming what the agent said, and tried again.
    busy = _observed(
        unloader,
        containerStatuses=[
            {
                "name": "agent",
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {"exitCode": 3, "message": "held by pid 4242 (train.py)"}
                },
            }
        ],
    )
    p = plan(m, [gone], [busy], {}, SETTINGS, {"a": []})
    o = outcome(p, "a")
    assert (o.phase, o.reason) == (Phase.FAILED, "UnloadFailed")
    assert "pid 4242 (train.py)" in o.message and (p.create, p.delete) == ([], [])
    # Only its success ends the node's record.
    done = _observed(unloader, phase="Succeeded")
    p = plan(m, [gone], [done], {}, SETTINGS, {"a": []})
    assert p.delete == [done.name] and p.create == []


def test_an_unloader_the_kubelet_gave_up_on_is_followed_by_another() -> None:
    m = module()
    gone = node("a", **{"gpu": "amd"})
    p = plan(m, [gone], [running(m, node("a"))], {}, SETTINGS, {"a": []})
    dead = _observed(_unloader_of(p), phase="Failed")
    p = plan(m, [gone], [dead], {}, SETTINGS, {"a": []})
    assert p.delete == [dead.name]
    assert _unloader_of(p)["metadata"]["name"] != dead.name


def test_an_update_makes_the_new_loader_pod_before_it_deletes_the_old_one() -> None:
    old, new = module(), module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    n = node("a")  # its label went on an earlier pass
    pod = running(old, n)
    p = plan(new, [n], [pod], all_exist(new, [n]), SETTINGS, {"a": []})
    (successor,) = p.create
    assert p.delete == [pod.name] and successor["metadata"]["name"] != pod.name
    assert successor["metadata"]["annotations"][MODULE_HASH] != pod.module_hash
    # The successor then runs: the old pod is not brought back, nor kept.
    both = [replace(pod, deleting=True), _observed(successor)]
    p = plan(new, [n], both, all_exist(new, [n]), SETTINGS, {"a": []})
    assert (p.create, p.delete, outcome(p, "a").reason) == ([], [], "Loading")


def test_an_old_pod_that_unloads_on_sigterm_is_gone_before_its_successor_loads() -> None:
    new = module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    n = node("a")
    old = legacy("xe-loader-a", "a")
    p = plan(new, [n], [old], all_exist(new, [n]), SETTINGS, {"a": []})
    assert (p.create, p.delete) == ([], [old.name])
    p = plan(new, [n], [replace(old, deleting=True)], all_exist(new, [n]), SETTINGS)
    assert (p.create, outcome(p, "a").reason) == ([], "Unloading")
    assert len(plan(new, [n], [], all_exist(new, [n]), SETTINGS).create) == 1


def test_a_pod_change_that_leaves_the_module_alone_keeps_it_loaded_and_labelled() -> None:
    before = module()
    after = module(rollout={"maxUnavailable": 1})
    after.spec.tolerations = [Toleration(key="example.com/maintenance", operator="Exists")]
    nodes = [node(x, **{READY: ""}) for x in "abc"]
    pods = [running(before, n) for n in nodes]
    assert pods[0].module_hash == running(after, nodes[0]).module_hash
    assert pods[0].config_hash != running(after, nodes[0]).config_hash

    p = plan(after, nodes, pods, all_exist(after, nodes), SETTINGS)
    # One new pod (the budget), nothing deleted and no label touched.
    (successor,) = p.create
    assert (p.delete, p.node_labels) == ([], {})
    assert sorted(o.reason for o in p.outcomes) == [
        "RefreshPending",
        "RefreshPending",
        "Refreshing",
    ]
    # While the new pod starts, the old one keeps the label; once it serves, the old one goes.
    fresh = _observed(successor)
    here = next(n for n in nodes if n.name == successor["spec"]["nodeName"])
    mine = [pods[nodes.index(here)], fresh]
    p = plan(after, [here], mine, all_exist(after, [here]), SETTINGS)
    assert (p.create, p.delete, p.node_labels) == ([], [], {})
    assert outcome(p, here.name).reason == "Refreshing"
    ready = replace(fresh, ready=True)
    p = plan(after, [here], [mine[0], ready], all_exist(after, [here]), SETTINGS)
    assert (p.create, p.delete, p.node_labels) == ([], [mine[0].name], {})


def test_an_old_pod_is_never_renewed_only_because_the_pod_changed() -> None:
    # It would unload on SIGTERM: a new agent image is no reason to reload the driver.
    m = module()
    n = node("a", **{READY: ""})
    pod = running(m, n, leaves_loaded=False, config_hash="from-an-older-operator")
    p = plan(m, [n], [pod], all_exist(m, [n]), SETTINGS)
    assert (p.create, p.delete, p.node_labels, outcome(p, "a").reason) == ([], [], {}, "Loaded")


def test_a_loader_pod_the_kubelet_gave_up_on_is_replaced_by_one_that_adopts_the_module() -> None:
    # Graceful node shutdown, eviction, admission refusal: the pod ends Failed with
    # the current config; the module it loaded may still be there.
    m = module()
    n = node("a", **{READY: ""})
    failed = running(m, n, ready=False, phase="Failed")
    p = plan(m, [n], [failed], all_exist(m, [n]), SETTINGS)
    (successor,) = p.create
    assert p.delete == [failed.name] and successor["metadata"]["name"] != failed.name
    assert p.node_labels == {"a": {READY: None}}


def test_labels_follow_the_pods_while_the_spec_cannot_be_planned() -> None:
    n = node("a", **{READY: ""})
    broken_pod = running(module(), n, ready=False)
    bad_mapping = module(kernelMappings=[{"literal": K1, "containerImage": "r.io/xe:${NOPE}"}])
    refused_by_agent = module(modprobe={"moduleName": "xe", "modulesLoadingOrder": ["xe"]})
    for m in (bad_mapping, refused_by_agent):
        p = plan(m, [n], [broken_pod], {}, SETTINGS)
        assert (p.node_labels, p.create, p.delete) == ({"a": {READY: None}}, [], [])
    assert labels_follow_pods(NS, NAME, [n], [broken_pod]) == {"a": {READY: None}}
    healthy = node("b")
    assert labels_follow_pods(NS, NAME, [healthy], [running(module(), healthy)]) == {
        "b": {READY: ""}
    }


def test_a_pod_from_before_pods_recorded_their_module_is_not_reloaded() -> None:
    m = module()
    n = node("a", **{READY: ""})
    pod = loader_pod(m, n, resolve(m, K1), SETTINGS)  # type: ignore[arg-type]
    ann = pod["metadata"]["annotations"]
    wanted = ann.pop(MODULE_HASH)
    ann[AGENT_CONFIG] = ann[AGENT_CONFIG].replace(
        "unloadOnTerminate: false", "unloadOnTerminate: true"
    )
    ann[CONFIG_HASH] = "from-an-older-operator"
    old = _observed(pod, conditions=[{"type": "Ready", "status": "True"}])
    assert (old.module_hash, old.leaves_loaded) == (wanted, False)
    p = plan(m, [n], [old], all_exist(m, [n]), SETTINGS)
    assert (p.create, p.delete, p.node_labels) == ([], [], {})


def test_a_loader_pod_is_node_critical_probes_patiently_and_runs_no_shell() -> None:
    m = module(modprobe={"moduleName": "xe", "firmwarePath": "/firmware"})
    builtin = LoaderSettings(agent_image="x/a:1", firmware_host_path="/lib/firmware")
    pod = loader_pod(m, node("a"), resolve(m, K1), builtin)  # type: ignore[arg-type]
    spec = pod["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    (agent,) = spec["containers"]
    probe = agent["readinessProbe"]
    # Answered by the serving agent over HTTP: no process per probe.
    assert probe["httpGet"] == {"path": "/readyz", "port": "readiness"}
    assert agent["ports"] == [{"name": "readiness", "containerPort": 8095}]
    assert agent["command"][-2:] == ["--readiness-port", "8095"]
    assert (probe["timeoutSeconds"], probe["failureThreshold"]) == (5, 3)
    assert agent["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert [c["command"][0] for c in spec["initContainers"]] == ["cp", "cp"]
    # No emptyDir (kubectl drain would refuse the pod): the copies of the image go to
    # the host, one directory per pod, named by its UID.
    assert not [v for v in spec["volumes"] if "emptyDir" in v]
    (staging,) = [v for v in spec["volumes"] if v["name"] == "staging"]
    assert staging["hostPath"] == {"path": "/var/lib/kmodkit/staging", "type": "DirectoryOrCreate"}
    copy = f"{m.metadata.namespace}.xe/$(KMODKIT_POD_UID)"
    uid = {"name": "KMODKIT_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    for extractor, part in zip(spec["initContainers"], ("modules", "firmware"), strict=True):
        assert extractor["env"] == [uid]
        assert extractor["volumeMounts"] == [
            {"name": "staging", "mountPath": "/staging", "subPathExpr": f"{copy}/{part}"}
        ]
        assert extractor["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    mounts = sorted(
        (v for v in agent["volumeMounts"] if v["name"] == "staging"), key=lambda v: v["mountPath"]
    )
    assert mounts == [
        # Where it claims its copy and removes the copies of pods long gone.
        {"name": "staging", "mountPath": "/host/var/lib/kmodkit/staging", "readOnly": False},
        {
            "name": "staging",
            "mountPath": "/kmod/firmware",
            "subPathExpr": f"{copy}/firmware",
            "readOnly": True,
        },
        # The agent may write modules.dep next to the copied modules.
        {
            "name": "staging",
            "mountPath": f"/kmod/opt/lib/modules/{K1}",
            "subPathExpr": f"{copy}/modules",
        },
    ]
    assert agent["env"] == [
        uid,
        {"name": "KMODKIT_STAGING_DIR", "value": f"/var/lib/kmodkit/staging/{copy}"},
    ]
    # The pod holds no data: the cluster autoscaler may remove the node.
    assert (
        pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    )


def test_an_unloader_takes_the_image_only_when_its_unload_runs_modprobe() -> None:
    gone = node("a", **{"gpu": "amd"})
    plain = module()
    p = plan(plain, [gone], [running(plain, node("a"))], {}, SETTINGS, {"a": []})
    assert "initContainers" not in _unloader_of(p)["spec"]
    raw = module(modprobe={"rawArgs": {"load": ["xe"], "unload": ["-r", "xe"]}})
    p = plan(raw, [gone], [running(raw, node("a"))], {}, SETTINGS, {"a": []})
    spec = _unloader_of(p)["spec"]
    (extractor,) = spec["initContainers"]
    assert extractor["image"] == f"r.io/xe:{K1}"
    assert extractor["command"] == ["cp", "-R", f"/opt/lib/modules/{K1}/.", "/staging/"]
    staging = [m for m in spec["containers"][0]["volumeMounts"] if "subPathExpr" in m]
    assert staging == [
        {
            "name": "staging",
            "mountPath": f"/kmod/opt/lib/modules/{K1}",
            "subPathExpr": "drivers.xe/$(KMODKIT_POD_UID)/modules",
        }
    ]


def test_an_unloader_copies_the_firmware_it_removes_from_the_host() -> None:
    gone = node("a", **{"gpu": "amd"})
    m = module(modprobe={"moduleName": "xe", "firmwarePath": "/firmware"})
    p = plan(m, [gone], [running(m, node("a"))], {}, SETTINGS, {"a": []})
    spec = _unloader_of(p)["spec"]
    (extractor,) = spec["initContainers"]
    assert extractor["name"] == "firmware-extractor"
    assert extractor["command"] == ["cp", "-R", "/firmware/.", "/staging/"]
    (agent,) = spec["containers"]
    firmware = next(m for m in agent["volumeMounts"] if m.get("mountPath") == "/kmod/firmware")
    assert firmware["subPathExpr"] == "drivers.xe/$(KMODKIT_POD_UID)/firmware"
    host = next(m for m in agent["volumeMounts"] if m["name"] == "host-firmware")
    # Where the loader put it (the default host path, the loader's configuration says).
    assert host == {
        "name": "host-firmware",
        "mountPath": "/host/var/lib/firmware",
        "readOnly": False,
    }
    # Removing files needs no sysfs write: never privileged.
    assert agent["securityContext"].get("privileged") is not True


def test_a_retired_node_whose_pod_is_already_leaving_still_gets_an_unloader() -> None:
    # An old pod unloads on SIGTERM, but if the device is busy it exits anyway:
    # only an unloader's success says the node has nothing loaded.
    m = module()
    gone = node("a", **{"gpu": "amd"})
    leaving = replace(legacy("xe-loader-a", "a"), deleting=True)
    p = plan(m, [gone], [leaving], {}, SETTINGS, {"a": []})
    assert _unloader_of(p)["spec"]["nodeName"] == "a" and p.delete == []


def test_an_update_while_a_new_pod_starts_takes_the_label_away_first() -> None:
    # The old pod still serves while the pod that renews it starts: replacing the
    # module there is an update like any other (the label goes, then the gated pods),
    # not the repair of a node with nothing working.
    before = module()
    renewed = module()
    renewed.spec.tolerations = [Toleration(key="example.com/maintenance", operator="Exists")]
    a = node("a", **{READY: ""})
    old = running(before, a)
    (starting,) = plan(renewed, [a], [old], all_exist(renewed, [a]), SETTINGS).create
    pods = [old, _observed(starting)]
    new = module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    new.spec.tolerations = renewed.spec.tolerations
    p = plan(new, [a], pods, all_exist(new, [a]), SETTINGS, {"a": ["x/dp"]})
    assert outcome(p, "a").reason == "WaitingForConsumers"
    assert (p.create, p.delete, p.node_labels) == ([], [], {"a": {READY: None}})


def test_a_node_whose_new_pod_starts_keeps_its_place_in_the_budget_for_an_update() -> None:
    # A Refresh under way counts against maxUnavailable; an update asked for meanwhile
    # must not let another node go beside it.
    before = module()
    renewed = module()
    renewed.spec.tolerations = [Toleration(key="example.com/maintenance", operator="Exists")]
    a, b = node("a", **{READY: ""}), node("b", **{READY: ""})
    old = running(before, a)
    (starting,) = plan(renewed, [a], [old], all_exist(renewed, [a]), SETTINGS).create
    pods = [old, _observed(starting), running(before, b)]
    new = module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    new.spec.tolerations = renewed.spec.tolerations
    p = plan(new, [a, b], pods, all_exist(new, [a, b]), SETTINGS)
    assert outcome(p, "b").reason == "UpdatePending" and "b" not in p.node_labels
    assert outcome(p, "a").reason == "WaitingForConsumers"
    assert p.node_labels == {"a": {READY: None}} and (p.create, p.delete) == ([], [])


def test_a_new_pod_the_kubelet_gave_up_on_is_removed_and_the_pod_renewed_again() -> None:
    # Its successor would take its name (it follows the same pod): asking for it again
    # is told it exists, so the ended pod must go first.
    before = module()
    after = module()
    after.spec.tolerations = [Toleration(key="example.com/maintenance", operator="Exists")]
    n = node("a", **{READY: ""})
    old = running(before, n)
    (successor,) = plan(after, [n], [old], all_exist(after, [n]), SETTINGS).create
    ended = _observed(successor, phase="Failed")
    p = plan(after, [n], [old, ended], all_exist(after, [n]), SETTINGS)
    assert (p.create, p.delete, p.node_labels) == ([], [ended.name], {})
    assert outcome(p, "a").phase is Phase.LOADED
    again = plan(after, [n], [old], all_exist(after, [n]), SETTINGS).create
    assert [pod["metadata"]["name"] for pod in again] == [ended.name]


def test_an_update_under_way_counts_before_a_refresh_of_a_node_not_labelled_yet() -> None:
    # a has just loaded the new module (its label comes this pass) but its pod is
    # outdated; b's update is under way and goes on whatever the budget says.
    old = module()
    untolerated = module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    new = module(
        modprobe={"moduleName": "xe", "parameters": ["debug=1"]}, rollout={"maxUnavailable": 1}
    )
    new.spec.tolerations = [Toleration(key="example.com/maintenance", operator="Exists")]
    a, b = node("a"), node("b")
    pods = [running(untolerated, a), running(old, b)]
    p = plan(new, [a, b], pods, all_exist(new, [a, b]), SETTINGS, {"b": []})
    assert outcome(p, "a").reason == "RefreshPending"
    assert [c["spec"]["nodeName"] for c in p.create] == ["b"]


def test_a_percentage_budget_is_of_the_selected_nodes_only() -> None:
    # Nodes the Module left whose unload keeps failing are reported, not targeted.
    old = module()
    new = module(
        modprobe={"moduleName": "xe", "parameters": ["debug=1"]}, rollout={"maxUnavailable": "50%"}
    )
    selected = [node(n, **{READY: ""}) for n in "ab"]
    left = [NodeView(n, {"gpu": "amd"}, K1) for n in "cd"]
    failing: dict[str, Any] = {
        "containerStatuses": [
            {
                "name": "agent",
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 3, "message": "held by pid 42"}},
            }
        ]
    }
    unloaders = []
    for n in left:
        retired = plan(old, [n], [running(old, node(n.name))], {}, SETTINGS, {n.name: []})
        unloaders.append(_observed(_unloader_of(retired), **failing))
    pods = [*(running(old, n) for n in selected), *unloaders]
    nodes = [*selected, *left]
    p = plan(new, nodes, pods, all_exist(new, nodes), SETTINGS)
    assert [o.reason for o in p.outcomes if o.node in "cd"] == ["UnloadFailed"] * 2
    assert len([n for n, c in p.node_labels.items() if c.get(READY, "") is None]) == 1


def test_a_pod_stays_while_an_earlier_successor_of_it_holds_its_successors_name() -> None:
    # The pod that was to renew it was deleted and is still going: the successor the
    # update asks for has that name, and the apiserver would say it exists.
    before = module()
    renewed = module()
    renewed.spec.tolerations = [Toleration(key="example.com/maintenance", operator="Exists")]
    a = node("a")  # the update's label went on an earlier pass
    old = running(before, a)
    (renewal,) = plan(renewed, [a], [old], all_exist(renewed, [a]), SETTINGS).create
    going = replace(_observed(renewal), deleting=True)
    new = module(modprobe={"moduleName": "xe", "parameters": ["debug=1"]})
    new.spec.tolerations = renewed.spec.tolerations
    p = plan(new, [a], [old, going], all_exist(new, [a]), SETTINGS, {"a": []})
    assert (p.create, p.delete) == ([], [])
    (successor,) = plan(new, [a], [old], all_exist(new, [a]), SETTINGS, {"a": []}).create
    assert successor["metadata"]["name"] == going.name


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([K1, K2, "5.14.0-1"]),  # the last kernel matches no mapping
            st.sampled_from(["none", "ready", "starting", "old", "other kernel"]),
            st.booleans(),  # selected
        ),
        max_size=8,
    ),
    st.sampled_from(list(ImageState)),
)
def test_the_images_a_plan_needs_do_not_depend_on_their_states(
    fleet: list[tuple[str, str, bool]], state: ImageState
) -> None:
    """A pass plans with the images' states it worked out for the images the last pass
    needed, and plans again only when this plan needs others (``NeededImages.covers``):
    which images, and which nodes need each, must follow from the nodes and pods alone."""
    old, new = module(), module(version="2")
    nodes, pods = [], []
    for i, (kernel, pod, selected) in enumerate(fleet):
        n = node(f"n{i}", kernel) if selected else replace(node(f"n{i}", kernel), labels={})
        nodes.append(n)
        # A pod runs a mapped kernel: the node's, or another one it booted from.
        mapped = replace(n, kernel=kernel if kernel in (K1, K2) else K1)
        if pod == "ready":
            pods.append(running(new, mapped))
        elif pod == "starting":
            pods.append(running(new, mapped, ready=False))
        elif pod == "old":
            pods.append(running(old, mapped))
        elif pod == "other kernel":
            pods.append(running(new, replace(n, kernel=K2 if kernel == K1 else K1)))
    unknown = plan(new, nodes, pods, {}, SETTINGS)
    known = {f"r.io/xe:{kernel}": ImageStatus(state) for kernel in (K1, K2)}
    stated = plan(new, nodes, pods, known, SETTINGS)
    assert stated.needed_images == unknown.needed_images
    assert stated.nodes_by_image == unknown.nodes_by_image
    assert NeededImages.of(unknown).covers(stated, known)


def test_needed_images_cover_a_plan_of_the_same_images_and_nodes_only() -> None:
    m = module()
    a, b = node("a", K1), node("b", K2)
    both = plan(m, [a, b], [], {}, SETTINGS)
    only_a = plan(m, [a], [], {}, SETTINGS)
    exists = {i: ImageStatus(ImageState.EXISTS) for i in both.needed_images}
    missing = {i: ImageStatus(ImageState.MISSING) for i in both.needed_images}
    assert NeededImages.of(both).covers(plan(m, [a, b], [], exists, SETTINGS), exists)
    assert not NeededImages.of(only_a).covers(both, exists)  # another image
    # The same image, another node: only a build or sign (some image not there) cares.
    a2 = node("a2", K1)
    more = plan(m, [a, a2], [], {}, SETTINGS)
    assert NeededImages.of(only_a).covers(more, {i: exists[i] for i in more.needed_images})
    assert not NeededImages.of(only_a).covers(more, {i: missing[i] for i in more.needed_images})
