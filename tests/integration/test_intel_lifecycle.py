"""The ClusterPolicy's driver Module through its lifecycle, on kmodkit's built-in engine.

A real operator (engine forced to ``builtin``), a real registry holding the
driver images and kwok nodes: the Module is garbage-collected with its
policy, an allocated GPU ResourceClaim holds it, a version switch between
empty and set recreates it while a bump patches it, and the device plugin runs
only where the engine has loaded the driver. None of this needs upstream
KMM's schema; the one check that does is tests/integration/test_kmm_schema.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kmodkit_dev import audit
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.operator import Operator
from kmodkit_dev.pki import ADMIN_TOKEN_USER
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration import intel_support
from tests.integration.crds_util import install
from tests.integration.intel_support import CP_GROUP, CP_PLURAL, CP_VERSION
from tests.unit.examples import minimal

# Two kernels, so one node can have its driver image while the other has none.
KERNELS = ("7.0.0-14-generic", "6.8.0-45-generic")
GROUP, VERSION, MODULES = "kmodkit.io", "v1alpha1", "modules"
DRIVER = "gpu.intel.com"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any, oci_registry: Registry) -> Iterator[str]:
    labels = {"kmodkit.io/operator-namespace": "true"}
    yield from intel_support.operator_namespace(kube_api, "il", oci_registry, labels)


@pytest.fixture(scope="module")
def operator(
    kube_api: Any,
    kubeconfig: str,
    operator_namespace: str,
    oci_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    install(kube_api)
    log = tmp_path_factory.mktemp("intel-lifecycle") / "operator.log"
    with intel_support.intel_operator(
        kubeconfig,
        log,
        operator_namespace,
        oci_registry,
        # The built-in engine whether or not KMM's API is served.
        KMODKIT_INTEL_ENGINE="builtin",
        # An image pushed during a test is found within seconds, not a minute.
        KMODKIT_IMAGE_RECHECK_SECONDS="3",
    ) as op:
        yield op


@pytest.fixture(scope="module")
def gpu_nodes(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str]]]:
    tag = uuid.uuid4().hex[:6]
    names = [f"il-{tag}-{i}" for i in range(len(KERNELS))]
    for made in intel_support.gpu_nodes(dev_cluster, names, list(KERNELS), tag):
        yield tag, made


def _image(reg: Registry, policy: str) -> str:
    return f"{reg.host}/kmods/xe-{policy}:$KERNEL_FULL_VERSION"


def _policy(name: str, tag: str, reg: Registry, **kernel_module: Any) -> dict[str, Any]:
    return intel_support.policy(name, tag, _image(reg, name), **kernel_module)


def _create(kube_api: Any, policy: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube_api).create_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, policy
    )


def _modules(kube_api: Any, namespace: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, MODULES
    )["items"]
    return {m["metadata"]["name"]: m for m in items}


_status = intel_support.policy_status


def _patch_spec(kube_api: Any, name: str, patch: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube_api).patch_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL, name, {"spec": patch}
    )


def _plugin_nodes(kube_api: Any, namespace: str, policy: str) -> list[str]:
    pods = client.CoreV1Api(kube_api).list_namespaced_pod(
        namespace, label_selector=f"app=intel-gpu-plugin,owner={policy}"
    )
    return sorted(p.spec.node_name for p in pods.items if not p.metadata.deletion_timestamp)


def _labels(kube_api: Any, node: str) -> dict[str, str]:
    return dict(client.CoreV1Api(kube_api).read_node(node).metadata.labels or {})


def test_deleting_the_policy_collects_its_module(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    tag, _ = gpu_nodes
    name = f"gc{tag}"
    _create(kube_api, _policy(name, tag, oci_registry))
    try:
        module = wait_until(
            lambda: _modules(kube_api, operator_namespace).get(f"{name}-gpu"), "the Module"
        )
        (owner,) = module["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("ClusterPolicy", name, True)
        assert wait_until(lambda: _status(kube_api, name).get("engine"), "status.engine") == (
            "Builtin"
        )
    finally:
        _delete_policy(kube_api, name)
    # The controller-manager's garbage collector removes it, not the operator.
    wait_until(
        lambda: f"{name}-gpu" not in _modules(kube_api, operator_namespace),
        "garbage collection of the Module",
        timeout=90,
    )


def test_device_plugin_runs_only_where_the_driver_is_ready(
    dev_cluster: devcluster.Cluster,
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    tag, nodes = gpu_nodes
    name = f"gate{tag}"
    ready = f"kmm.node.kubernetes.io/{operator_namespace}.{name}-gpu.ready"
    image = _image(oci_registry, name)
    # The driver image exists for the first node's kernel only.
    oci_registry.push(image.replace("$KERNEL_FULL_VERSION", KERNELS[0]))
    since = client.CustomObjectsApi(kube_api).list_cluster_custom_object(
        CP_GROUP, CP_VERSION, CP_PLURAL
    )["metadata"]["resourceVersion"]
    history = History(kube_api, operator_namespace, name, since)
    _create(kube_api, _policy(name, tag, oci_registry))
    try:
        wait_until(
            lambda: _status(kube_api, name).get("devicePluginStatus") == "1/1",
            "the device plugin on the one node whose driver is loaded",
            timeout=90,
        )
        assert ready in _labels(kube_api, nodes[0])
        assert ready not in _labels(kube_api, nodes[1])
        assert _plugin_nodes(kube_api, operator_namespace, name) == [nodes[0]]
        ds = client.AppsV1Api(kube_api).read_namespaced_daemon_set(
            f"{name}-device-plugin", operator_namespace
        )
        assert ds.spec.template.spec.node_selector[ready] == ""

        # Once the second kernel's image appears the engine loads it there, and
        # the device plugin follows the readiness label.
        oci_registry.push(image.replace("$KERNEL_FULL_VERSION", KERNELS[1]))
        status = wait_until(
            lambda: (
                (s := _status(kube_api, name)).get("devicePluginStatus") == "2/2"
                and s.get("kmmStatus") == "2/2"
                and s
            ),
            "the driver and the device plugin on both nodes",
            timeout=90,
        )
        assert status["engine"] == "Builtin"
        assert ready in _labels(kube_api, nodes[1])
        assert _plugin_nodes(kube_api, operator_namespace, name) == sorted(nodes)
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        # Applied once over every pass since (the apiserver's own count): the plugin's
        # empty args and tolerations, stored as no field, hold as they are.
        applies = [
            r
            for r in audit.requests(dev_cluster.log("audit"), ADMIN_TOKEN_USER)
            if r.get("verb") == "patch"
            and r["objectRef"].get("resource") == "daemonsets"
            and r["objectRef"].get("namespace") == operator_namespace
            and r["objectRef"].get("name") == f"{name}-device-plugin"
        ]
        assert len(applies) == 1, applies
        # Ready only with the driver loaded and the plugin running everywhere, in every
        # stored version of the status: never on the components' first 0/0.
        seen = history.columns()
        assert any(ready == "True" for *_, ready in seen), seen
        assert all((kmm, dp) == ("2/2", "2/2") for kmm, dp, ready in seen if ready == "True"), seen
    finally:
        history.stop()
        _delete_policy(kube_api, name)


def test_version_switch_recreates_the_module_and_a_bump_patches_it(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    tag, _ = gpu_nodes
    name = f"ver{tag}"
    module_name = f"{name}-gpu"
    _create(kube_api, _policy(name, tag, oci_registry))
    try:
        module = wait_until(
            lambda: _modules(kube_api, operator_namespace).get(module_name), "the Module"
        )
        assert "version" not in module["spec"]["moduleLoader"]["container"]

        # Switching version between empty and set recreates the Module ...
        uid = module["metadata"]["uid"]
        _patch_spec(kube_api, name, {"kernelModule": {"version": "v1"}})
        recreated = wait_until(
            lambda: (
                (m := _modules(kube_api, operator_namespace).get(module_name))
                and m["metadata"]["uid"] != uid
                and m
            ),
            "the Module recreated with a version",
        )
        assert recreated["spec"]["moduleLoader"]["container"]["version"] == "v1"
        # ... while a bump with both set patches it in place.
        _patch_spec(kube_api, name, {"kernelModule": {"version": "v2"}})
        bumped = wait_until(
            lambda: (
                (m := _modules(kube_api, operator_namespace).get(module_name))
                and m["spec"]["moduleLoader"]["container"].get("version") == "v2"
                and m
            ),
            "the version bump",
        )
        assert bumped["metadata"]["uid"] == recreated["metadata"]["uid"]

        # And back to empty: recreated again.
        _patch_spec(kube_api, name, {"kernelModule": {"version": None}})
        cleared = wait_until(
            lambda: (
                (m := _modules(kube_api, operator_namespace).get(module_name))
                and m["metadata"]["uid"] != bumped["metadata"]["uid"]
                and m
            ),
            "the Module recreated without a version",
        )
        assert "version" not in cleared["spec"]["moduleLoader"]["container"]
    finally:
        _delete_policy(kube_api, name)


def test_an_allocated_gpu_claim_holds_the_module_until_released(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    tag, nodes = gpu_nodes
    name = f"guard{tag}"
    module_name = f"{name}-gpu"
    device_class = f"intel-test-{tag}"
    _create(kube_api, _policy(name, tag, oci_registry))
    claim = None
    try:
        wait_until(lambda: module_name in _modules(kube_api, operator_namespace), "the Module")
        assert wait_until(lambda: _status(kube_api, name).get("engine"), "status.engine") == (
            "Builtin"
        )
        claim = _allocated_claim(kube_api, operator_namespace, device_class)
        _patch_spec(kube_api, name, {"kernelModule": None})
        blocked = wait_until(
            lambda: (e := _status(kube_api, name).get("errors")) and "blocking" in e[0] and e,
            "the claim guard's message",
        )
        assert blocked == [
            f"allocated GPU ResourceClaims blocking modules.{GROUP}/{module_name} deletion"
        ]
        assert _status(kube_api, name)["blockingClaims"] == [f"{operator_namespace}/{claim}"]
        assert module_name in _modules(kube_api, operator_namespace)
        # Without kernelModule there is no readiness gate: the device plugin runs
        # on both nodes while the Module is still held.
        wait_until(
            lambda: _status(kube_api, name).get("devicePluginStatus") == "2/2",
            "the ungated device plugin",
        )
        assert _plugin_nodes(kube_api, operator_namespace, name) == sorted(nodes)
        assert module_name in _modules(kube_api, operator_namespace)

        _release(kube_api, operator_namespace, claim)
        wait_until(
            lambda: module_name not in _modules(kube_api, operator_namespace),
            "the Module to be removed once the claim is released",
            timeout=90,
        )
        wait_until(lambda: _status(kube_api, name).get("kmmStatus") == "N/A", "kmmStatus N/A")
    finally:
        # A claim left allocated would hold every other test's Modules too.
        if claim is not None:
            _delete(kube_api, "resourceclaims", claim, operator_namespace)
        _delete(kube_api, "deviceclasses", device_class)
        _delete_policy(kube_api, name)


def _delete_policy(kube_api: Any, name: str) -> None:
    try:
        client.CustomObjectsApi(kube_api).delete_cluster_custom_object(
            CP_GROUP, CP_VERSION, CP_PLURAL, name
        )
    except ApiException as err:
        if err.status != 404:
            raise


def _delete(kube_api: Any, plural: str, name: str, namespace: str | None = None) -> None:
    objects = client.CustomObjectsApi(kube_api)
    try:
        if namespace:
            objects.delete_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, plural, name
            )
        else:
            objects.delete_cluster_custom_object("resource.k8s.io", "v1", plural, name)
    except ApiException as err:
        if err.status != 404:
            raise


def _release(kube_api: Any, namespace: str, claim: str) -> None:
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        claim,
        {"status": {"allocation": None}},
    )


def _allocated_claim(
    kube_api: Any, namespace: str, device_class: str, name: str = "inference"
) -> str:
    """A claim with a device allocated from Intel's driver, written as the scheduler would."""
    objects = client.CustomObjectsApi(kube_api)
    objects.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        {"metadata": {"name": device_class}, "spec": {}},
    )
    objects.create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            },
        },
    )
    objects.patch_namespaced_custom_object_status(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        name,
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": "node-0",
                                "device": "gpu-0",
                            }
                        ]
                    }
                }
            }
        },
    )
    return name


def _policy_exists(kube_api: Any, name: str) -> bool:
    try:
        client.CustomObjectsApi(kube_api).get_cluster_custom_object(
            CP_GROUP, CP_VERSION, CP_PLURAL, name
        )
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def test_deleting_the_policy_waits_while_a_gpu_claim_is_allocated(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    """The policy keeps its finalizer while a GPU claim is allocated, so garbage
    collection cannot take the driver's Module; releasing the claim lets both go."""
    tag, _ = gpu_nodes
    name = f"del{tag}"
    module_name = f"{name}-gpu"
    device_class = f"intel-del-{tag}"
    _create(kube_api, _policy(name, tag, oci_registry))
    claim = None
    try:
        wait_until(lambda: module_name in _modules(kube_api, operator_namespace), "the Module")
        wait_until(
            lambda: (
                "kmodkit.io/module-finalizer"
                in (
                    client.CustomObjectsApi(kube_api)
                    .get_cluster_custom_object(CP_GROUP, CP_VERSION, CP_PLURAL, name)["metadata"]
                    .get("finalizers")
                    or []
                )
            ),
            "the policy's finalizer",
        )
        claim = _allocated_claim(kube_api, operator_namespace, device_class, name="training")
        _delete_policy(kube_api, name)
        held = wait_until(
            lambda: (s := _status(kube_api, name)).get("blockingClaims") and s,
            "the deletion to be held and said so",
        )
        assert held["errors"] == [
            f"allocated GPU ResourceClaims blocking modules.{GROUP}/{module_name} deletion"
        ]
        assert held["blockingClaims"] == [f"{operator_namespace}/{claim}"]
        time.sleep(3)  # a few guard passes later, still held
        assert _policy_exists(kube_api, name)
        assert module_name in _modules(kube_api, operator_namespace)

        _release(kube_api, operator_namespace, claim)
        wait_until(lambda: not _policy_exists(kube_api, name), "the policy to go", timeout=60)
        wait_until(
            lambda: module_name not in _modules(kube_api, operator_namespace),
            "garbage collection of the Module",
            timeout=90,
        )
    finally:
        if claim is not None:
            _delete(kube_api, "resourceclaims", claim, operator_namespace)
        _delete(kube_api, "deviceclasses", device_class)
        _delete_policy(kube_api, name)


def test_a_module_the_api_server_refuses_is_an_error_in_the_policy_status(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    """An admission policy refuses the policy's Module: the ClusterPolicy says so in
    status.errors with the API server's message, and is not Ready."""
    tag, _ = gpu_nodes
    name = f"ref{tag}"
    vap = f"refuse-{tag}"
    message = "refused by the test's admission policy"
    admission = client.AdmissionregistrationV1Api(kube_api)
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": vap},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["modules"],
                        }
                    ]
                },
                "validations": [
                    {"expression": f"object.metadata.name != '{name}-gpu'", "message": message}
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {"metadata": {"name": vap}, "spec": {"policyName": vap, "validationActions": ["Deny"]}}
    )
    try:
        wait_until(
            lambda: _refused(kube_api, operator_namespace, f"{name}-gpu"),
            "the admission policy to take effect",
            timeout=30,
        )
        _create(kube_api, _policy(name, tag, oci_registry))
        status = wait_until(
            lambda: (s := _status(kube_api, name)) and _reconcile_errors(s) and s,
            "the refusal in status.errors",
        )
        (error,) = _reconcile_errors(status)
        assert error.startswith(f"failed to reconcile Module {name}-gpu for ClusterPolicy {name}: ")
        assert message in error
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False"
    finally:
        _delete_policy(kube_api, name)
        admission.delete_validating_admission_policy_binding(vap)
        admission.delete_validating_admission_policy(vap)


def _reconcile_errors(status: dict[str, Any]) -> list[str]:
    return [e for e in status.get("errors") or [] if e.startswith("failed to reconcile")]


def _refused(kube_api: Any, namespace: str, module: str) -> bool:
    """Whether a (dry-run) Module of that name is refused now."""
    body = minimal()
    body["metadata"] = {"name": module, "namespace": namespace}
    body["spec"]["selector"] = {"nothing": "here"}
    try:
        client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, MODULES, body, dry_run="All"
        )
    except ApiException as err:
        return err.status == 422 or err.status == 403
    return False


class History:
    """Every change the test cares about, in the order the watches deliver them: the
    policy's kmmStatus, and the operator namespace's loader and unloader pods; and each
    stored version of the policy's status as (kmmStatus, devicePluginStatus, Ready).
    ``since``: the resourceVersion the policy's watch starts from (to see a policy from
    its creation on)."""

    def __init__(
        self, kube_api: Any, namespace: str, policy: str, since: str | None = None
    ) -> None:
        self.events: list[tuple[str, ...]] = []
        self._columns: list[tuple[str, str, str]] = []
        self._since = since
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._pods, args=(kube_api, namespace), daemon=True),
            threading.Thread(target=self._policy, args=(kube_api, policy), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _add(self, *event: str) -> None:
        with self._lock:
            if not self.events or self.events[-1] != event:
                self.events.append(event)

    def _pods(self, kube_api: Any, namespace: str) -> None:
        core = client.CoreV1Api(kube_api)
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=240):
            if self._stop.is_set():
                return
            pod = ev["object"]
            component = (pod.metadata.labels or {}).get("app.kubernetes.io/component", "")
            if component in ("module-loader", "module-unloader"):
                owner = (pod.metadata.owner_references or [None])[0]
                self._add(
                    component,
                    ev["type"],
                    pod.spec.node_name or "",
                    pod.status.phase or "",
                    owner.uid if owner else "",
                )

    def _policy(self, kube_api: Any, policy: str) -> None:
        objects = client.CustomObjectsApi(kube_api)
        w = watch.Watch()
        for ev in w.stream(
            objects.list_cluster_custom_object,
            CP_GROUP,
            CP_VERSION,
            CP_PLURAL,
            field_selector=f"metadata.name={policy}",
            resource_version=self._since,
            timeout_seconds=240,
        ):
            if self._stop.is_set():
                return
            status = ev["object"].get("status") or {}
            self._add("kmmStatus", str(status.get("kmmStatus")))
            ready = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
            with self._lock:
                self._columns.append(
                    (
                        str(status.get("kmmStatus")),
                        str(status.get("devicePluginStatus")),
                        str(ready.get("Ready")),
                    )
                )

    def stop(self) -> None:
        self._stop.set()

    def index(self, match: Callable[[tuple[str, ...]], bool]) -> int:
        with self._lock:
            return next(i for i, e in enumerate(self.events) if match(e))

    def columns(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return list(self._columns)

    def statuses(self) -> list[str]:
        with self._lock:
            return [e[1] for e in self.events if e[0] == "kmmStatus"]


def test_recreating_and_removing_unload_every_node_in_between(
    operator: Operator,
    kube_api: Any,
    operator_namespace: str,
    oci_registry: Registry,
    gpu_nodes: tuple[str, list[str]],
) -> None:
    """A version switch between empty and set shows Recreating, and the old Module's
    unloaders finish on every node before the new Module loads anything; removing
    kernelModule shows Removing, and the unloaders finish before the Module is gone."""
    tag, nodes = gpu_nodes
    name = f"phase{tag}"
    module_name = f"{name}-gpu"
    image = _image(oci_registry, name)
    for kernel in KERNELS:
        oci_registry.push(image.replace("$KERNEL_FULL_VERSION", kernel))
    key = f"kmm.node.kubernetes.io/version-module.{operator_namespace}.{module_name}"
    _create(kube_api, _policy(name, tag, oci_registry))
    history = History(kube_api, operator_namespace, name)
    try:
        wait_until(lambda: _status(kube_api, name).get("kmmStatus") == "2/2", "the driver loaded")
        old = _modules(kube_api, operator_namespace)[module_name]["metadata"]["uid"]
        _patch_spec(kube_api, name, {"kernelModule": {"version": "v1"}})
        new = wait_until(
            lambda: (
                (m := _modules(kube_api, operator_namespace).get(module_name))
                and m["metadata"]["uid"] != old
                and m["metadata"]["uid"]
            ),
            "the Module recreated with a version",
            timeout=90,
        )
        # With a version, a node loads once it is labelled for it.
        for node in nodes:
            client.CoreV1Api(kube_api).patch_node(node, {"metadata": {"labels": {key: "v1"}}})
        wait_until(
            lambda: _status(kube_api, name).get("kmmStatus") == "2/2", "reloaded", timeout=90
        )
        assert "Recreating" in history.statuses()
        first_new = history.index(lambda e: e[0] == "module-loader" and e[4] == new)
        for node in nodes:
            unloaded = history.index(
                lambda e, n=node: e[0] == "module-unloader" and e[2:] == (n, "Succeeded", old)
            )
            assert unloaded < first_new, history.events

        _patch_spec(kube_api, name, {"kernelModule": None})
        wait_until(lambda: _status(kube_api, name).get("kmmStatus") == "N/A", "removed", timeout=90)
        assert module_name not in _modules(kube_api, operator_namespace)
        statuses = history.statuses()
        assert statuses.index("Removing") > statuses.index("Recreating")
        removing = history.index(lambda e: e == ("kmmStatus", "Removing"))
        for node in nodes:
            # Unloaders of the versioned Module, after Removing began.
            done = [
                i
                for i, e in enumerate(history.events)
                if i > removing and e[0] == "module-unloader" and e[2:] == (node, "Succeeded", new)
            ]
            assert done, history.events
    finally:
        history.stop()
        _delete_policy(kube_api, name)
        for node in nodes:
            client.CoreV1Api(kube_api).patch_node(node, {"metadata": {"labels": {key: None}}})
