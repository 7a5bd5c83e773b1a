"""The built-in engine on a real cluster, with a real registry (auth + TLS).

kwok nodes of three kernels; images for one kernel already pushed, another
kernel's built in-cluster (kwok runs no containers, so this test is a stand-in
for kmodkit-build, the buildah builder: when a build Job appears it pushes an
image to the Job's ``--destination``, as the builder would), the third kernel
unmapped.
"""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kmodkit_dev import build
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_gone, wait_until
from tests.chaos.watch_feed import WatchFeed
from tests.integration.crds_util import install

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
PUSHED, BUILT, UNMAPPED = "6.8.0-45-generic", "7.0.0-14-generic", "5.14.0-427.el9.x86_64"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def fleet(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"eng-{tag}-{k}-{i}" for k in ("a", "b", "c") for i in range(3)]
    kernels = {"a": PUSHED, "b": BUILT, "c": UNMAPPED}
    devcluster.add_nodes(
        dev_cluster,
        [node_manifest(n, kernels[n.split("-")[2]], {"engine-test": tag}) for n in names],
    )
    yield tag, names
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for n in names:
        core.delete_node(n)


@pytest.fixture(scope="module")
def operator(
    kubeconfig: str, kube_api: Any, oci_registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    install(kube_api)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    # A long re-check interval, so only a forced re-check can find a late push.
    with running_operator(
        kubeconfig,
        log,
        KMODKIT_REGISTRY_CA=str(oci_registry.ca),
        KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:test",
        KMODKIT_IMAGE_RECHECK_SECONDS="600",
    ) as op:
        yield op


def _secret(kube_api: Any, namespace: str, reg: Registry) -> None:
    client.CoreV1Api(kube_api).create_namespaced_secret(namespace, reg.pull_secret("pull"))


def _module(name: str, tag: str, reg: Registry, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": name},
        "spec": {
            "selector": {"engine-test": tag},
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe", "firmwarePath": "/firmware"},
                    "kernelMappings": [
                        {
                            "literal": PUSHED,
                            "containerImage": f"{reg.host}/kmods/xe:${{KERNEL_FULL_VERSION}}",
                        },
                        {
                            "regexp": r"^7\.0\.0-.*-generic$",
                            "containerImage": f"{reg.host}/kmods/xe:${{KERNEL_FULL_VERSION}}",
                            "build": {"dockerfileConfigMap": {"name": "xe-build"}},
                        },
                    ],
                    **container,
                }
            },
        },
    }


class Builder:
    """Stand-in for kmodkit-build: pushes to the build Job's ``--destination``, once per Job."""

    def __init__(self, kube_api: Any, namespace: str, reg: Registry) -> None:
        self.built: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(kube_api, namespace, reg), daemon=True
        )
        self._thread.start()

    def _run(self, kube_api: Any, namespace: str, reg: Registry) -> None:
        batch = client.BatchV1Api(kube_api)
        w = watch.Watch()
        for ev in w.stream(batch.list_namespaced_job, namespace, timeout_seconds=300):
            if self._stop.is_set():
                break
            job = ev["object"]
            if ev["type"] == "ADDED":
                (container,) = job.spec.template.spec.containers
                (image,) = [
                    a.split("=", 1)[1] for a in container.args if a.startswith("--destination=")
                ]
                assert image == job.metadata.annotations["kmodkit.io/image"]
                reg.push(image)
                self.built.append(image)

    def stop(self) -> None:
        self._stop.set()


def _pods(kube_api: Any, namespace: str) -> dict[str, Any]:
    items = (
        client.CoreV1Api(kube_api)
        .list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=module-loader")
        .items
    )
    return {p.spec.node_name: p for p in items}


def _labels(kube_api: Any, node: str) -> dict[str, str]:
    return dict(client.CoreV1Api(kube_api).read_node(node).metadata.labels or {})


def _available(kube_api: Any, namespace: str, name: str, part: str, want: int) -> dict[str, Any]:
    """The Module's status once ``status.<part>.availableNumber`` is ``want``."""
    return wait_until(
        lambda: (
            (s := _status(kube_api, namespace, name)).get(part, {}).get("availableNumber") == want
            and s
        ),
        f"status.{part}.availableNumber {want}",
    )


def _status(kube_api: Any, namespace: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return dict(obj.get("status") or {})


def test_module_builds_missing_images_once_loads_and_labels_ready_nodes(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, names = fleet
    _secret(kube_api, namespace, oci_registry)
    client.CoreV1Api(kube_api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "xe-build"}, "data": {"dockerfile": "FROM scratch\n"}}
    )
    oci_registry.push(f"{oci_registry.host}/kmods/xe:{PUSHED}")
    builder = Builder(kube_api, namespace, oci_registry)
    objs = client.CustomObjectsApi(kube_api)
    try:
        objs.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _module("xe", tag, oci_registry)
        )
        ready = f"kmm.node.kubernetes.io/{namespace}.xe.ready"
        mapped = [n for n in names if "-c-" not in n]
        wait_until(
            lambda: all(ready in _labels(kube_api, n) for n in mapped),
            "ready labels on the mapped nodes",
            timeout=90,
        )
    finally:
        builder.stop()
    # Only the missing image was built, and once, though two nodes need it.
    assert builder.built == [f"{oci_registry.host}/kmods/xe:{BUILT}"]
    jobs = client.BatchV1Api(kube_api).list_namespaced_job(namespace).items
    assert len(jobs) == 1
    events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    assert any(e.reason == "BuildCreated" and jobs[0].metadata.name in e.message for e in events)
    pods = _pods(kube_api, namespace)
    assert sorted(pods) == sorted(mapped)
    for node, pod in pods.items():
        kernel = PUSHED if "-a-" in node else BUILT
        assert pod.spec.init_containers[0].image == f"{oci_registry.host}/kmods/xe:{kernel}"
        assert pod.spec.image_pull_secrets[0].name == "pull"
    for n in names:
        if "-c-" in n:
            assert ready not in _labels(kube_api, n)
    status = _available(kube_api, namespace, "xe", "moduleLoader", len(mapped))
    # As KMM: nodes no mapping serves are reported, but neither desired nor failing.
    unmapped = {u["node"]: u["kernel"] for u in status["unmappedNodes"]}
    assert unmapped == {n: UNMAPPED for n in names if "-c-" in n}
    assert status["nodeFailures"] == []
    assert status["moduleLoader"]["desiredNumber"] == len(mapped)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Degraded"]["status"] == "False"

    # Pods of another component gated on the readiness label run only on ready nodes.
    apps = client.AppsV1Api(kube_api)
    apps.create_namespaced_daemon_set(
        namespace,
        {
            "metadata": {"name": "device-plugin"},
            "spec": {
                "selector": {"matchLabels": {"app": "dp"}},
                "template": {
                    "metadata": {"labels": {"app": "dp"}},
                    "spec": {
                        "nodeSelector": {ready: "", "engine-test": tag},
                        "containers": [{"name": "dp", "image": "registry.invalid/dp:1"}],
                    },
                },
            },
        },
    )
    wait_until(
        lambda: (
            apps.read_namespaced_daemon_set("device-plugin", namespace).status.number_ready
            == len(mapped)
        ),
        "device plugin pods on the ready nodes",
    )
    dp_nodes = {
        p.spec.node_name
        for p in client.CoreV1Api(kube_api)
        .list_namespaced_pod(namespace, label_selector="app=dp")
        .items
    }
    assert dp_nodes == set(mapped)
    apps.delete_namespaced_daemon_set("device-plugin", namespace)

    # Deleting the Module unloads everywhere and removes every label.
    objs.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "xe")
    wait_until(lambda: not _pods(kube_api, namespace), "loader pods to be gone", timeout=60)

    wait_gone(
        lambda: objs.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "xe"),
        "the Module, released by its finalizer,",
    )
    for n in names:
        assert not [
            k
            for k in _labels(kube_api, n)
            if k.startswith(f"kmm.node.kubernetes.io/{namespace}.xe")
        ]


def _simple_module(
    name: str, tag: str, reg: Registry, image: str, **container: Any
) -> dict[str, Any]:
    body = _module(name, tag, reg, **container)
    body["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"literal": PUSHED, "containerImage": image}
    ]
    body["spec"]["moduleLoader"]["container"]["modprobe"] = {"moduleName": name}
    return body


def _a_nodes(names: list[str]) -> list[str]:
    return [n for n in names if "-a-" in n]


def _apply_simple(
    kube_api: Any,
    namespace: str,
    reg: Registry,
    tag: str,
    name: str,
    image: str,
    pushed: bool = True,
    **container: Any,
) -> str:
    """Create a one-mapping Module (its image pushed first unless ``pushed`` is False);
    returns the Module's readiness label key."""
    _secret(kube_api, namespace, reg)
    if pushed:
        reg.push(image)
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _simple_module(name, tag, reg, image, **container)
    )
    return f"kmm.node.kubernetes.io/{namespace}.{name}.ready"


def _all_labelled(kube_api: Any, nodes: list[str], key: str) -> bool:
    return all(key in _labels(kube_api, n) for n in nodes)


def _delete_and_wait_unload(kube_api: Any, namespace: str, name: str) -> None:
    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    wait_until(lambda: not _pods(kube_api, namespace), "unload", timeout=60)


def test_ordered_upgrade_reloads_only_the_labelled_node(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, names = fleet
    a0, a1, a2 = _a_nodes(names)
    _secret(kube_api, namespace, oci_registry)
    for v in ("v1", "v2"):
        oci_registry.push(f"{oci_registry.host}/kmods/ou:{v}")
    core = client.CoreV1Api(kube_api)
    want = f"kmm.node.kubernetes.io/version-module.{namespace}.ou"
    ready = f"kmm.node.kubernetes.io/{namespace}.ou.ready"
    vready = f"kmm.node.kubernetes.io/{namespace}.ou.version.ready"
    for n in (a0, a1):
        core.patch_node(n, {"metadata": {"labels": {want: "v1"}}})
    objs = client.CustomObjectsApi(kube_api)
    objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        _simple_module("ou", tag, oci_registry, f"{oci_registry.host}/kmods/ou:v1", version="v1"),
    )
    wait_until(
        lambda: all(_labels(kube_api, n).get(vready) == "v1" for n in (a0, a1)),
        "v1 loaded on the labelled nodes",
    )
    assert ready not in _labels(kube_api, a2)  # never labelled: nothing loaded
    before = {n: p.metadata.uid for n, p in _pods(kube_api, namespace).items()}

    objs.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "ou",
        {
            "spec": {
                "moduleLoader": {
                    "container": {
                        "version": "v2",
                        "kernelMappings": [
                            {
                                "literal": PUSHED,
                                "containerImage": f"{oci_registry.host}/kmods/ou:v2",
                            }
                        ],
                    }
                }
            }
        },
    )
    core.patch_node(a0, {"metadata": {"labels": {want: "v2"}}})
    wait_until(lambda: _labels(kube_api, a0).get(vready) == "v2", "v2 loaded on the upgraded node")
    pods = _pods(kube_api, namespace)
    assert pods[a0].spec.init_containers[0].image.endswith("/kmods/ou:v2")
    # The node not yet relabelled keeps its v1 pod (same object) and its labels.
    assert pods[a1].metadata.uid == before[a1]
    assert _labels(kube_api, a1).get(vready) == "v1" and ready in _labels(kube_api, a1)
    status = _status(kube_api, namespace, "ou")
    assert "AwaitingVersionLabel" not in {f["reason"] for f in status.get("nodeFailures", [])}
    objs.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ou")
    for n in (a0, a1):
        core.patch_node(n, {"metadata": {"labels": {want: None}}})
    wait_until(lambda: not _pods(kube_api, namespace), "unload", timeout=60)


def test_spec_change_reloads_nodes_within_the_budget(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, names = fleet
    a_nodes = _a_nodes(names)
    ready = _apply_simple(
        kube_api, namespace, oci_registry, tag, "bud", f"{oci_registry.host}/kmods/bud:1"
    )
    objs = client.CustomObjectsApi(kube_api)
    wait_until(lambda: _all_labelled(kube_api, a_nodes, ready), "initial load")
    first = {n: p.metadata.uid for n, p in _pods(kube_api, namespace).items()}

    # Every stored version of the nodes, in order: polling node by node would add up
    # labels read at different moments, and a brief overrun could fall between polls.
    unready: set[str] = set()
    worst = [0]

    def see(_type: str, node: dict[str, Any], _relisted: bool) -> None:
        name = node["metadata"]["name"]
        if name not in a_nodes:
            return
        if ready in (node["metadata"].get("labels") or {}):
            unready.discard(name)
        else:
            unready.add(name)
        worst[0] = max(worst[0], len(unready))

    feed = WatchFeed(
        "nodes", client.CoreV1Api(kube_api).list_node, see, label_selector=f"engine-test={tag}"
    )
    assert feed.synced.wait(10)
    try:
        objs.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            "bud",
            {
                "spec": {
                    "rollout": {"maxUnavailable": 1},
                    "moduleLoader": {"container": {"modprobe": {"parameters": ["debug=1"]}}},
                }
            },
        )

        def all_replaced() -> bool:
            pods = _pods(kube_api, namespace)
            return all(n in pods and pods[n].metadata.uid != first[n] for n in a_nodes) and all(
                ready in _labels(kube_api, n) for n in a_nodes
            )

        wait_until(all_replaced, "every node reloaded", timeout=90)
    finally:
        feed.stop()
    assert not feed.errors
    assert worst[0] == 1  # one node at a time, never more
    _delete_and_wait_unload(kube_api, namespace, "bud")


def test_image_pushed_after_a_failed_check_is_found_by_a_forced_recheck(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, names = fleet
    a_nodes = _a_nodes(names)
    image = f"{oci_registry.host}/kmods/late:1"
    ready = _apply_simple(kube_api, namespace, oci_registry, tag, "late", image, pushed=False)
    objs = client.CustomObjectsApi(kube_api)

    def missing() -> bool:
        fails = _status(kube_api, namespace, "late").get("nodeFailures", [])
        return {f["node"] for f in fails if f["reason"] == "ImageMissing"} == set(a_nodes)

    wait_until(missing, "the missing image to be reported per node")
    fail = next(
        f
        for f in _status(kube_api, namespace, "late")["nodeFailures"]
        if f["reason"] == "ImageMissing"
    )
    assert image in fail["message"] and "push it or add a build" in fail["message"]
    oci_registry.push(image)
    objs.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "late", {"spec": {"imageRebuildTriggerGeneration": 1}}
    )
    wait_until(
        lambda: _all_labelled(kube_api, a_nodes, ready),
        "the late image to load after the forced re-check",
        timeout=30,
    )
    _delete_and_wait_unload(kube_api, namespace, "late")


def _set_pod_ready(kube_api: Any, namespace: str, pod: str, ready: bool) -> None:
    status = "True" if ready else "False"
    client.CoreV1Api(kube_api).patch_namespaced_pod_status(
        pod,
        namespace,
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": status},
                    {"type": "ContainersReady", "status": status},
                ]
            }
        },
    )


def test_readiness_label_follows_what_is_really_loaded(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    """After a reboot the agent's probe fails until the module is loaded again; the
    label must follow it, not a record of an earlier load."""
    tag, names = fleet
    a0 = _a_nodes(names)[0]
    ready = _apply_simple(
        kube_api, namespace, oci_registry, tag, "rb", f"{oci_registry.host}/kmods/rb:1"
    )
    wait_until(lambda: ready in _labels(kube_api, a0), "initial load")
    pod = _pods(kube_api, namespace)[a0].metadata.name
    _set_pod_ready(kube_api, namespace, pod, False)
    wait_until(lambda: ready not in _labels(kube_api, a0), "the label to go with the module")
    _set_pod_ready(kube_api, namespace, pod, True)
    wait_until(lambda: ready in _labels(kube_api, a0), "the label to return on reload")
    # Loaded twice is one Event counted twice (kubectl shows "x2"), on the node; the
    # Module gets none per node (its status counts them: one write per node fewer).
    # The probe failing is "not ready", not "unloaded": nothing unloaded the module.
    # The Event follows the label write (after the pass's pod writes): wait for it too.
    wait_until(
        lambda: (
            sorted((e.reason, e.count) for e in _events(kube_api, "default", a0, f"{namespace}/rb"))
            == [("ModuleLoaded", 2), ("ModuleNotReady", 1)]
        ),
        "the node's Events",
        explain=lambda: _events(kube_api, "default", a0, f"{namespace}/rb"),
    )
    (not_ready,) = [
        e.message
        for e in _events(kube_api, "default", a0, f"{namespace}/rb")
        if e.reason == "ModuleNotReady"
    ]
    # It says what the plan does there: the pod that no longer serves is being started.
    assert not_ready == (
        f"Module {namespace}/rb is no longer ready on this node: loader pod {pod} is starting"
    ), not_ready
    on_module = _events(kube_api, namespace, "rb", f"node {a0}")
    assert [e.reason for e in on_module if e.reason.startswith("Module")] == [], on_module
    # Deleting the Module unloads it: that, once its unloader succeeded, is ModuleUnloaded.
    _delete_and_wait_unload(kube_api, namespace, "rb")
    wait_until(
        lambda: (
            [
                (e.reason, e.message)
                for e in _events(kube_api, "default", a0, f"{namespace}/rb")
                if e.reason == "ModuleUnloaded"
            ]
            == [("ModuleUnloaded", f"Module {namespace}/rb unloaded from the kernel")]
        ),
        "ModuleUnloaded on the node",
    )


def test_deleting_the_namespace_of_a_module_never_deadlocks(
    operator: Operator,
    kube_api: Any,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, names = fleet
    core = client.CoreV1Api(kube_api)
    ns = f"t-gone-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    ready = _apply_simple(kube_api, ns, oci_registry, tag, "nsd", f"{oci_registry.host}/kmods/ns:1")
    a_nodes = _a_nodes(names)
    wait_until(lambda: _all_labelled(kube_api, a_nodes, ready), "load")
    core.delete_namespace(ns)

    wait_gone(lambda: core.read_namespace(ns), "the namespace", timeout=120)
    for n in a_nodes:
        assert ready not in _labels(kube_api, n)


def test_a_retired_node_keeps_its_module_until_gated_pods_leave(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    """A node that stops being targeted (here: a taint the Module does not tolerate)
    loses the readiness label first; its module stays while a pod gated on that label
    still runs there, and unloads once the pod is gone."""
    tag, names = fleet
    node = _a_nodes(names)[0]
    ready = _apply_simple(
        kube_api, namespace, oci_registry, tag, "ret", f"{oci_registry.host}/kmods/ret:1"
    )
    core = client.CoreV1Api(kube_api)
    wait_until(lambda: _all_labelled(kube_api, [node], ready), "initial load")
    loader = _pods(kube_api, namespace)[node].metadata.name
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "holder"},
            "spec": {
                "nodeName": node,
                "nodeSelector": {ready: ""},
                "containers": [{"name": "dp", "image": "registry.invalid/dp:1"}],
            },
        },
    )
    taint = {"key": "kmodkit-test/retire", "value": tag, "effect": "NoSchedule"}
    core.patch_node(node, {"spec": {"taints": [taint]}})
    try:
        wait_until(lambda: ready not in _labels(kube_api, node), "the label to go")
        # Passes run on every node and pod change; give several the chance to unload.
        still = threading.Event()
        still.wait(5)
        pod = _pods(kube_api, namespace).get(node)
        assert pod is not None and pod.metadata.name == loader, "unloaded under a gated pod"
        assert pod.metadata.deletion_timestamp is None, "unloading under a gated pod"
        # The held unload is told once on each object, however many passes saw it.
        for about, ns in ((node, "default"), ("ret", namespace)):
            (held,) = [e for e in _events(kube_api, ns, about) if "holder" in e.message]
            assert (held.reason, held.type, held.count) == ("UnloadHeld", "Normal", 1)
        core.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)
        wait_until(lambda: node not in _pods(kube_api, namespace), "the unload", timeout=60)
    finally:
        core.patch_node(node, {"spec": {"taints": None}})
    _delete_and_wait_unload(kube_api, namespace, "ret")


def test_a_failed_unload_keeps_the_finalizer_and_names_the_holder(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
) -> None:
    """Deleting a Module unloads through an unloader pod, and only its success lets
    the Module go. The node here is not kwok's: the test plays its kubelet (a
    stand-in), marking the loader pod ready, finishing deletions, and reporting the
    unloader's first try as a kubelet reports a container that exited with a
    termination message (the agent's: who holds the device), then its success."""
    core = client.CoreV1Api(kube_api)
    tag = uuid.uuid4().hex[:6]
    node = f"hand-{tag}"
    manifest = node_manifest(node, PUSHED, {"engine-test": tag})
    manifest["metadata"]["annotations"] = {}
    core.create_node(manifest)
    try:
        core.patch_node_status(
            node, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        )
        ready = _apply_simple(
            kube_api, namespace, oci_registry, tag, "uf", f"{oci_registry.host}/kmods/uf:1"
        )
        wait_until(lambda: node in _pods(kube_api, namespace), "a loader pod")
        loader = _pods(kube_api, namespace)[node].metadata.name
        _set_pod_ready(kube_api, namespace, loader, True)
        wait_until(lambda: ready in _labels(kube_api, node), "the ready label")

        client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "uf"
        )
        unloader = wait_until(lambda: _unloader(kube_api, namespace, node), "an unloader pod")
        assert ready not in _labels(kube_api, node), "unloading while still labelled"
        wait_until(
            lambda: _pods(kube_api, namespace)[node].metadata.deletion_timestamp is not None,
            "the loader pod to be deleted once the unloader exists",
        )
        core.delete_namespaced_pod(loader, namespace, grace_period_seconds=0)

        held = "refusing to unload: xe has 1 open reference(s) held by pid 4242 (train.py)"
        core.patch_namespaced_pod_status(unloader, namespace, {"status": _crash_looping(held)})
        wait_until(
            lambda: any(
                e.reason == "UnloadFailed" and e.type == "Warning" and "pid 4242" in e.message
                for e in core.list_namespaced_event(
                    namespace, field_selector="involvedObject.name=uf"
                ).items
            ),
            "a Warning naming the holder",
        )
        threading.Event().wait(5)  # several passes: the finalizer must hold
        assert _module_exists(kube_api, namespace, "uf"), "released with the module loaded"
        for about, ns in ((node, "default"), ("uf", namespace)):
            refused = [e for e in _events(kube_api, ns, about) if e.reason == "UnloadFailed"]
            assert [(e.type, e.count) for e in refused] == [("Warning", 1)], refused
            assert "pid 4242" in refused[0].message
        # The status says it too, not what the last pass before the deletion saw.
        (failure,) = _status(kube_api, namespace, "uf")["nodeFailures"]
        assert failure["node"] == node and failure["reason"] == "UnloadFailed"
        assert "pid 4242" in failure["message"]

        core.patch_namespaced_pod_status(unloader, namespace, {"status": {"phase": "Succeeded"}})
        # A finished pod is deleted at once, with no kubelet to wait for.
        wait_until(lambda: _gone(kube_api, namespace, unloader), "the unloader to be cleaned up")
        wait_until(lambda: not _module_exists(kube_api, namespace, "uf"), "the finalizer to go")
    finally:
        core.delete_node(node)


def _unloader(kube_api: Any, namespace: str, node: str) -> str | None:
    items = (
        client.CoreV1Api(kube_api)
        .list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=module-unloader"
        )
        .items
    )
    return next((p.metadata.name for p in items if p.spec.node_name == node), None)


def _gone(kube_api: Any, namespace: str, pod: str) -> bool:
    try:
        client.CoreV1Api(kube_api).read_namespaced_pod(pod, namespace)
    except ApiException as e:
        return e.status == 404
    return False


def _module_exists(kube_api: Any, namespace: str, name: str) -> bool:
    try:
        client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def _crash_looping(message: str) -> dict[str, Any]:
    """A pod status as the kubelet reports a container that exited with ``message``."""
    return {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "agent",
                "image": "registry.invalid/kmodkit/agent:test",
                "imageID": "",
                "ready": False,
                "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
                "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": message}},
            }
        ],
    }


def _build_module(name: str, tag: str, reg: Registry, image: str) -> dict[str, Any]:
    """A Module whose only mapping (the b nodes' kernel) builds ``image``."""
    body = _simple_module(name, tag, reg, image)
    body["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {
            "literal": BUILT,
            "containerImage": image,
            "build": {"dockerfileConfigMap": {"name": f"{name}-build"}},
        }
    ]
    return body


def _start_build_module(
    kube_api: Any, namespace: str, reg: Registry, tag: str, name: str
) -> tuple[str, str]:
    """Create ``name`` building a fresh image; returns the image and the readiness label."""
    image = f"{reg.host}/kmods/{name}-{uuid.uuid4().hex[:6]}:1"
    _secret(kube_api, namespace, reg)
    core: Any = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": f"{name}-build"}, "data": {"dockerfile": "FROM scratch\n"}},
    )
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _build_module(name, tag, reg, image)
    )
    return image, f"kmm.node.kubernetes.io/{namespace}.{name}.ready"


def _build_jobs(kube_api: Any, namespace: str) -> dict[str, Any]:
    """Build Jobs by their attempt annotation."""
    batch: Any = client.BatchV1Api(kube_api)
    items = batch.list_namespaced_job(namespace).items
    return {j.metadata.annotations.get("kmodkit.io/build-attempt"): j for j in items}


def _events(kube_api: Any, namespace: str, about: str, mentioning: str = "") -> list[Any]:
    """The Events about the object named ``about`` whose message mentions ``mentioning``."""
    core: Any = client.CoreV1Api(kube_api)
    items = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={about}")
    return [e for e in items.items if mentioning in (e.message or "")]


def _event_reasons(kube_api: Any, namespace: str, about: str) -> list[str]:
    core: Any = client.CoreV1Api(kube_api)
    items = core.list_namespaced_event(namespace).items
    return sorted(e.reason for e in items if e.reason.startswith("Build") and about in e.message)


def test_a_build_posts_each_event_once_and_records_them_on_its_job(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, names = fleet
    b_nodes = [n for n in names if "-b-" in n]
    builder = Builder(kube_api, namespace, oci_registry)
    try:
        _image, ready = _start_build_module(kube_api, namespace, oci_registry, tag, "bev")
        wait_until(
            lambda: _all_labelled(kube_api, b_nodes, ready), "the built image loaded", timeout=90
        )
    finally:
        builder.stop()
    job = _build_jobs(kube_api, namespace)["1"]
    name = job.metadata.name

    def reported() -> str:
        batch: Any = client.BatchV1Api(kube_api)
        read = batch.read_namespaced_job(name, namespace)
        return str((read.metadata.annotations or {}).get("kmodkit.io/build-reported", ""))

    wait_until(lambda: reported() == "started,succeeded", "the build events recorded on the Job")
    # A later pass (the trigger bump makes one, and status says when it ran) finds
    # the image there, builds nothing and repeats no event.
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "bev", {"spec": {"imageRebuildTriggerGeneration": 1}}
    )
    wait_until(
        lambda: _status(kube_api, namespace, "bev").get("imageRebuildTriggerGeneration") == 1,
        "the rebuild trigger echoed in status",
    )
    assert list(_build_jobs(kube_api, namespace)) == ["1"]
    assert _event_reasons(kube_api, namespace, name) == [
        "BuildCreated",
        "BuildStarted",
        "BuildSucceeded",
    ]
    _delete_and_wait_unload(kube_api, namespace, "bev")


def test_a_bumped_rebuild_trigger_retries_a_failed_build_without_its_back_off(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    tag, _names = fleet
    # Nobody pushes: kwok completes the build pod, and 60 s later the missing
    # image makes it a failed build, to be retried after a 30 s back-off.
    image, _ready = _start_build_module(kube_api, namespace, oci_registry, tag, "btr")
    first: Any = wait_until(
        lambda: _build_jobs(kube_api, namespace).get("1"), "the first build Job"
    )
    wait_until(
        lambda: "BuildFailed" in _event_reasons(kube_api, namespace, first.metadata.name),
        "the first build reported failed",
        timeout=120,
    )
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "btr", {"spec": {"imageRebuildTriggerGeneration": 1}}
    )
    second: Any = wait_until(lambda: _build_jobs(kube_api, namespace).get("2"), "the retry")
    # Made for the bumped trigger (the back-off's own retry would carry none), and its
    # own back-off starts from the first step.
    annotations = second.metadata.annotations
    assert annotations["kmodkit.io/rebuild-trigger"] == "1"
    assert annotations["kmodkit.io/build-retry"] == "0"
    assert annotations["kmodkit.io/image"] == image
    wait_until(
        lambda: _status(kube_api, namespace, "btr").get("imageRebuildTriggerGeneration") == 1,
        "the rebuild trigger echoed in status",
    )
    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "btr"
    )


def test_a_refused_pod_is_reported_and_the_rest_of_the_pass_goes_on(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    """A quota lets one loader pod in: the others are refused by the API server, the
    Module says so (condition and Warning, with the API's own message), and the node
    whose pod was made still gets its label in the same passes."""
    tag, names = fleet
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}
    )
    # The quota admits nothing until its controller has counted what is there.
    wait_until(
        lambda: core.read_namespaced_resource_quota("one-pod", namespace).status.hard or {},
        "the quota to be counted",
    )
    ready = _apply_simple(
        kube_api, namespace, oci_registry, tag, "quota", f"{oci_registry.host}/kmods/quota:1"
    )
    a_nodes = _a_nodes(names)
    wait_until(
        lambda: sum(ready in _labels(kube_api, n) for n in a_nodes) == 1, "the admitted node"
    )

    def degraded() -> str:
        conditions = _status(kube_api, namespace, "quota").get("conditions") or []
        return next(
            (
                c["message"]
                for c in conditions
                if c["type"] == "Degraded" and c["reason"] == "ApplyFailed"
            ),
            "",
        )

    message = wait_until(degraded, "the refusal in status")
    assert "exceeded quota" in message and "creating Pod" in message, message
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=quota")
    refused = [e for e in events.items if e.reason == "ApplyFailed"]
    assert refused and all(e.type == "Warning" and "exceeded quota" in e.message for e in refused)
    assert all("<bound method" not in e.message for e in refused)
    core.delete_namespaced_resource_quota("one-pod", namespace)
    wait_until(lambda: _all_labelled(kube_api, a_nodes, ready), "every node once admitted", 90)
    _delete_and_wait_unload(kube_api, namespace, "quota")


def test_the_device_plugin_runs_where_the_module_is_ready_and_leaves_before_it_unloads(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    """KMM's devicePlugin: the DaemonSet (run by the real DaemonSet controller, its pods
    by kwok) lands only on nodes carrying the readiness label; status counts it; and
    deleting the Module takes the plugin off each node before the module unloads."""
    tag, names = fleet
    image = f"{oci_registry.host}/kmods/dp:1"
    _secret(kube_api, namespace, oci_registry)
    oci_registry.push(image)
    body = _simple_module("dp", tag, oci_registry, image)
    body["spec"]["devicePlugin"] = {"container": {"image": "registry.invalid/xe-dp:1"}}
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    ready = f"kmm.node.kubernetes.io/{namespace}.dp.ready"
    a_nodes = _a_nodes(names)
    wait_until(lambda: _all_labelled(kube_api, a_nodes, ready), "the module on the a nodes")
    core = client.CoreV1Api(kube_api)

    def plugin_nodes() -> set[str]:
        pods = core.list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=device-plugin"
        ).items
        return {p.spec.node_name for p in pods if p.metadata.deletion_timestamp is None}

    wait_until(lambda: plugin_nodes() == set(a_nodes), "a plugin pod on each ready node", 90)
    status = _available(kube_api, namespace, "dp", "devicePlugin", len(a_nodes))
    assert status["devicePlugin"]["desiredNumber"] == len(a_nodes)
    plugin_ready = f"kmm.node.kubernetes.io/{namespace}.dp.device-plugin-ready"
    wait_until(lambda: _all_labelled(kube_api, a_nodes, plugin_ready), "device-plugin-ready")
    assert not any(plugin_ready in _labels(kube_api, n) for n in names if n not in a_nodes)

    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "dp"
    )
    # Each node's module stays until the plugin has left it.
    while _pods(kube_api, namespace) or _unloader_nodes(kube_api, namespace):
        unloading = _unloader_nodes(kube_api, namespace)
        assert not unloading & plugin_nodes(), "unloading under a running device plugin"
        threading.Event().wait(0.2)
    wait_until(lambda: not _module_exists(kube_api, namespace, "dp"), "the finalizer to go")
    assert not any(plugin_ready in _labels(kube_api, n) for n in names)


def _unloader_nodes(kube_api: Any, namespace: str) -> set[str]:
    pods = (
        client.CoreV1Api(kube_api)
        .list_namespaced_pod(
            namespace, label_selector="app.kubernetes.io/component=module-unloader"
        )
        .items
    )
    return {p.spec.node_name for p in pods}


def test_kubectl_drain_evicts_a_loader_pod_without_flags_and_nothing_unloads(
    operator: Operator,
    kube_api: Any,
    kubeconfig: str,
    namespace: str,
    oci_registry: Registry,
    fleet: tuple[str, list[str]],
) -> None:
    """A plain ``kubectl drain`` (no ``--force``, no ``--delete-emptydir-data``) evicts
    the Module's loader pod: it has a controller and keeps its copy of the image on the
    host, not in an emptyDir. The engine gives the cordoned node a new loader pod, which
    adopts the loaded module: no unloader is made. (The drain is limited to this
    Module's pods, as other tests leave bare pods on the fleet's nodes.)"""
    tag, names = fleet
    a0 = _a_nodes(names)[0]
    ready = _apply_simple(
        kube_api, namespace, oci_registry, tag, "dr", f"{oci_registry.host}/kmods/dr:1"
    )
    wait_until(lambda: ready in _labels(kube_api, a0), "initial load")
    evicted = _pods(kube_api, namespace)[a0].metadata.uid
    kubectl = [str(build.binary("kubectl")), f"--kubeconfig={kubeconfig}"]
    try:
        drained = subprocess.run(
            [*kubectl, "drain", a0, "--pod-selector=kmodkit.io/module=dr", "--timeout=60s"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert drained.returncode == 0, drained.stderr
        assert "evicted" in drained.stdout, drained.stdout
        wait_until(
            lambda: (
                (p := _pods(kube_api, namespace).get(a0)) is not None
                and p.metadata.uid != evicted
                and ready in _labels(kube_api, a0)
            ),
            "a new loader pod on the drained node, and the label back",
        )
    finally:
        subprocess.run([*kubectl, "uncordon", a0], check=True, capture_output=True)
    unloaders = client.CoreV1Api(kube_api).list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/component=module-unloader"
    )
    assert unloaders.items == []
