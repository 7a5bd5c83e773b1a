"""The module-loader planner: which pods, which labels, within which budget."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.api import Module
from kmodkit.core.engine.kernel_mapping import resolve
from kmodkit.core.engine.loader_plan import (
    Context,
    ImageState,
    ImageStatus,
    LoaderPlan,
    NodeStep,
    Phase,
    Update,
    decide,
    gated_on,
    max_unavailable,
    plan,
)
from kmodkit.core.engine.loader_pod import (
    CONFIG_HASH,
    KERNEL,
    MODULE_VERSION,
    LoaderPod,
    LoaderSettings,
    loader_pod,
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


def running(m: Module, n: NodeView, ready: bool = True, version: str = "") -> LoaderPod:
    resolved = resolve(m, n.kernel)
    assert not isinstance(resolved, type(None))
    pod = loader_pod(m, n, resolved, SETTINGS)  # type: ignore[arg-type]
    ann = pod["metadata"]["annotations"]
    return LoaderPod(
        pod["metadata"]["name"],
        n.name,
        ann[CONFIG_HASH],
        ann[KERNEL],
        version or ann[MODULE_VERSION],
        ready,
    )


def outcome(p: LoaderPlan, name: str) -> Any:
    return next(o for o in p.outcomes if o.node == name)


def test_first_load_creates_one_pod_per_selected_node_with_the_resolved_image() -> None:
    m = module()
    nodes = [node("a"), node("b", K2), NodeView("other", {"gpu": "amd"}, K1)]
    p = plan(m, nodes, [], all_exist(m, nodes), SETTINGS)
    pods = {pod["spec"]["nodeName"]: pod for pod in p.create}
    assert sorted(pods) == ["a", "b"]
    assert pods["b"]["spec"]["initContainers"][0]["image"] == f"r.io/xe:{K2}"
    assert (
        "cp -R /opt/lib/modules/7.0.0-14-generic"
        in pods["b"]["spec"]["initContainers"][0]["command"][2]
    )
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
    assert (o.phase, o.reason) == (Phase.FAILED, "NoMapping")
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
    p = plan(m_new, [n], pods, all_exist(m_new, [n]), SETTINGS, {"a": []})
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


def test_raw_args_are_refused_with_the_field_named() -> None:
    m = module(modprobe={"rawArgs": {"load": ["xe"], "unload": ["-r", "xe"]}})
    p = plan(m, [node("a")], [], {}, SETTINGS)
    assert p.module_error.startswith("spec.moduleLoader.container.modprobe.rawArgs")


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
    assert isinstance(decide(n, running(old, n), ctx), Update)
    broken = decide(n, running(old, n, ready=False), ctx)
    assert isinstance(broken, NodeStep)
    assert broken.delete == running(old, n).name and broken.labels == {READY: None}
    assert broken.outcome is not None and broken.outcome.reason == "Replacing"


def test_a_node_held_back_by_its_version_label_keeps_only_a_pod_on_its_kernel() -> None:
    v1, v2 = module(version="v1"), module(version="v2")
    here = node("a", **{WANT: "v1", READY: "", VREADY: "v1"})
    ctx = Context.of(v2, all_exist(v2, [here]), SETTINGS)
    kept = decide(here, running(v1, here), ctx)
    assert isinstance(kept, NodeStep)
    assert (kept.delete, kept.labels) == (None, {})
    assert kept.outcome is not None and kept.outcome.reason == "AwaitingVersionLabel"
    rebooted = node("a", K2, **{WANT: "v1", READY: "", VREADY: "v1"})
    gone = decide(rebooted, running(v1, here), ctx)
    assert isinstance(gone, NodeStep)
    assert (gone.delete, gone.labels) == (None, {READY: None, VREADY: None})
    unlabelled = node("a", K2, **{WANT: "v1"})
    ctx = Context.of(v2, all_exist(v2, [here]), SETTINGS, {"a": []})
    gone = decide(unlabelled, running(v1, here), ctx)
    assert isinstance(gone, NodeStep) and gone.delete == running(v1, here).name


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
    p = plan(m, [gone_labels], [pod], {}, SETTINGS, {"a": []})
    assert p.delete == [pod.name]


def test_an_invalid_mapping_leaves_the_node_and_its_pod_alone() -> None:
    bad = module(kernelMappings=[{"literal": K1, "containerImage": "r.io/xe:${NOPE}"}])
    n = node("a", **{READY: ""})
    step = decide(n, running(module(), n), Context.of(bad, {}, SETTINGS))
    assert isinstance(step, NodeStep)
    assert (step.delete, step.create, step.labels, step.image) == (None, None, {}, None)
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
