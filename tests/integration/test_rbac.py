"""Least privilege, proven live: the real operator with only the chart's ServiceAccount token.

The chart is installed with every backend enabled, a token is requested for its
ServiceAccount, and the real operator, configured from the chart's own
Deployment, drives with nothing but that token:

- a Module through a build, loading on kwok nodes and deletion (the engine);
- an Intel ClusterPolicy on the built-in engine: its driver Module loaded, the
  device plugin and XPU Manager on the ready nodes, the status columns; a switch
  to the DRA driver and back; the driver removed, then the policy deleted;
- a Tenstorrent driver policy installed, then bumped so every container node
  rolls one at a time through cordon, eviction of its device holder, swap and
  uncordon; a firmware policy flashing a node, then re-flashing it (forceWrite).

The apiserver's audit log then says which permissions were used: none may have
been refused, and every one granted, by the ClusterRole or the namespaced Role,
must have been used or be justified in docs/security.md. The same run checks the
operator's metrics (every one the chart's alerts and dashboard read among them)
and ``kubectl kmodkit``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from kmodkit.backends.intel_xe import device_plugin, dra_driver, xpu_manager
from kmodkit_dev import audit, build, procs
from kmodkit_dev import cluster as devcluster
from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import running_operator, token_kubeconfig
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration import test_intel_lifecycle as intel
from tests.integration import test_tt_firmware as ttfw
from tests.integration.helm import CHART, Grant, Helm, grants
from tests.integration.promql import PROMETHEUS_SERIES, chart_queries, metric_names
from tests.integration.test_tt_driver import (
    GATE,
    KMD,
    Fleet,
    Watcher,
    _all_at,
    _holders,
    _running_on,
    _uncordoned,
)
from tests.integration.test_tt_support import (
    DRIVER,
    FIRMWARE,
    FakeBuilder,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    node_labels,
    patch_policy,
    status,
)

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
PUSHED, BUILT, UNMAPPED = "6.8.0-45-generic", "7.0.0-14-generic", "5.14.0-427.el9.x86_64"
ADMIN_ACCESS = "resource.kubernetes.io/admin-access"


def justified() -> set[Grant]:
    """(group, resource, verb) rows of docs/security.md's list of unexercised permissions.

    A row names one API group / resource and one or more verbs, comma-separated.
    """
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("### Granted but not exercised by the RBAC test", 1)[1].split("\n#", 1)[0]
    found = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and not cells[0].startswith(("API group", "---")):
            group, _, resource = cells[0].rpartition("/")
            found |= {(group, resource, verb.strip()) for verb in cells[1].split(",")}
    return found


def used_and_refused(audit_log: Path, user: str) -> tuple[set[Grant], list[str]]:
    used: set[Grant] = set()
    refused = []
    for ev in audit.requests(audit_log, user):
        if "objectRef" not in ev:
            continue
        ref = ev["objectRef"]
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
        group = ref.get("apiGroup", "")
        code = ev.get("responseStatus", {}).get("code")
        if code == 403:
            refused.append(f"{ev['verb']} {ev['requestURI']}")
            continue
        used.add((group, resource, ev["verb"]))
        if ev["verb"] == "patch" and code == 201:
            # A server-side apply that created the object: authorized as a create too.
            used.add((group, resource, "create"))
    return used, refused


def chart_env(kube_api: Any, namespace: str, deployment: str) -> dict[str, str]:
    """The operator's settings as the chart's Deployment gives them (literal values only)."""
    dep = client.AppsV1Api(kube_api).read_namespaced_deployment(deployment, namespace)
    (container,) = dep.spec.template.spec.containers
    return {e.name: e.value for e in container.env or [] if e.value is not None}


class Builder(threading.Thread):
    """Stand-in for kmodkit-build (kwok runs no containers): pushes to each new build Job's
    ``--destination``."""

    def __init__(self, kube_api: Any, namespace: str, reg: Registry) -> None:
        super().__init__(daemon=True)
        self.kube_api, self.namespace, self.reg = kube_api, namespace, reg
        self.stopped = threading.Event()

    def run(self) -> None:
        batch = client.BatchV1Api(self.kube_api)
        seen: set[str] = set()
        while not self.stopped.is_set():
            # Short watches, so a stop is noticed without a connection cut under the thread.
            for ev in watch.Watch().stream(
                batch.list_namespaced_job, self.namespace, timeout_seconds=2
            ):
                job = ev["object"]
                if job.metadata.name not in seen:
                    seen.add(job.metadata.name)
                    (container,) = job.spec.template.spec.containers
                    (image,) = [
                        a.split("=", 1)[1] for a in container.args if a.startswith("--destination=")
                    ]
                    self.reg.push(image)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


class ServedMetrics(threading.Thread):
    """Every sample name the operator's ``/metrics`` served while it ran, scraped each
    second: a policy's series go with the policy, so one scrape at the end sees few."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.names: set[str] = set()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(1):
            with contextlib.suppress(OSError):  # not serving yet
                self.names |= {name for name, _ in _metrics(self.port)}

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


@dataclass
class Nodes:
    tag: str
    release: str
    module: list[str]  # the Module scenario's: two pushed kernels, one built, one unmapped
    intel: list[str]  # the ClusterPolicy's, both on the pushed kernel
    tt: Fleet  # three container-managed Tenstorrent nodes and one with DKMS
    firmware: str  # the node the firmware policy flashes

    @property
    def ns(self) -> str:
        """The chart's namespace: the operator, the Intel operands, the Tenstorrent pods."""
        return f"{self.release}-system"

    @property
    def account(self) -> str:
        return f"{self.release}-kmodkit"


@pytest.fixture
def fleet(dev_cluster: devcluster.Cluster, kube_api: Any) -> Iterator[Nodes]:
    tag = uuid.uuid4().hex[:6]
    release = f"rb-{tag}"
    kernels = {"a0": PUSHED, "a1": PUSHED, "b0": BUILT, "c0": UNMAPPED}
    nodes = Nodes(
        tag=tag,
        release=release,
        module=[f"rbac-{tag}-{k}" for k in kernels],
        intel=[f"rbac-{tag}-xe{i}" for i in range(2)],
        tt=Fleet(kube_api, f"{release}-system", tag),
        firmware=f"ttf-{tag}-0",
    )
    devcluster.add_nodes(
        dev_cluster,
        [
            *(
                node_manifest(n, kernels[n.rsplit("-", 1)[1]], {"rbac-test": tag})
                for n in nodes.module
            ),
            *(_gpu_node(n, tag) for n in nodes.intel),
        ],
    )
    # Device holders run where the deploy gate is "true", the contract of deploy gates.
    add_fleet(dev_cluster, kube_api, nodes.tt.all_nodes, {"ttd-test": tag, GATE: "true"})
    add_fleet(dev_cluster, kube_api, [nodes.firmware], {"ttf-test": tag})
    yield nodes
    delete_nodes(kube_api, [*nodes.module, *nodes.intel, *nodes.tt.all_nodes, nodes.firmware])


def _gpu_node(name: str, tag: str) -> dict[str, Any]:
    """A node on the pushed kernel advertising the resource XPU Manager requests in dp mode,
    as the GPU device plugin would."""
    node = node_manifest(name, PUSHED, {"intel-test": tag})
    for field in ("capacity", "allocatable"):
        node["status"][field][f"{intel.DRIVER}/monitoring"] = "1"
    return node


def _module(tag: str, reg: Registry) -> dict[str, Any]:
    image = f"{reg.host}/kmods/rbac:${{KERNEL_FULL_VERSION}}"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": "xe"},
        "spec": {
            "selector": {"rbac-test": tag},
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "kernelMappings": [
                        {"literal": PUSHED, "containerImage": image},
                        {
                            "literal": BUILT,
                            "containerImage": image,
                            "build": {"dockerfileConfigMap": {"name": "xe-build"}},
                        },
                    ],
                }
            },
        },
    }


def _metrics(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _kubectl(kubeconfig: str, *args: str) -> str:
    """``kubectl …``, with ``kubectl kmodkit`` found on PATH the way kubectl finds plugins."""
    build.ensure(["kubernetes"])
    kubectl = str(build.binary("kubectl"))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    out = subprocess.run(
        [kubectl, *args],
        env={**os.environ, "PATH": path, "KUBECONFIG": kubeconfig, "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _pull_secret(kube_api: Any, namespace: str, reg: Registry) -> None:
    client.CoreV1Api(kube_api).create_namespaced_secret(namespace, reg.pull_secret("pull"))


def _gone(read: Any) -> bool:
    try:
        read()
    except ApiException as e:
        return e.status == 404
    return False


def test_operator_runs_every_backend_with_only_the_charts_permissions(
    dev_cluster: devcluster.Cluster,
    kubeconfig: str,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    fleet: Nodes,
    tmp_path: Path,
) -> None:
    helm = Helm(tmp_path, kubeconfig)
    helm.run(
        "install", fleet.release, str(CHART), "-n", namespace, "--wait", "--timeout", "120s",
        "--set", f"namespace.name={fleet.ns}",
        # The built-in engine whether or not KMM's API is served; images found within seconds.
        "--set", "controller.env.KMODKIT_INTEL_ENGINE=builtin,controller.imageRecheckSeconds=3",
        # Other tests applied the admission policies from crds/, outside any release.
        "--take-ownership",
    )  # fmt: skip
    try:
        _drive(dev_cluster, kubeconfig, kube_api, namespace, oci_registry, fleet, tmp_path)
    finally:
        helm.run(
            "uninstall", fleet.release, "-n", namespace, "--wait", "--timeout", "60s", ok=False
        )


def _drive(
    dev_cluster: devcluster.Cluster,
    kubeconfig: str,
    kube_api: Any,
    namespace: str,
    reg: Registry,
    fleet: Nodes,
    tmp_path: Path,
) -> None:
    ns, account = fleet.ns, fleet.account
    token_config = token_kubeconfig(
        dev_cluster.kubeconfig, ns, account, kube_api, tmp_path / "operator.kubeconfig"
    )
    env = chart_env(kube_api, ns, account)
    assert env["KMODKIT_BACKENDS"] == "intel_xe,tenstorrent"
    metrics_port = procs.free_port()
    with running_operator(
        str(token_config),
        tmp_path / "operator.log",
        **{
            **env,
            "KMODKIT_METRICS_PORT": str(metrics_port),
            "KMODKIT_REGISTRY_CA": str(reg.ca),
        },
    ) as op:
        served = ServedMetrics(metrics_port)
        served.start()
        try:
            _module_scenario(kubeconfig, kube_api, namespace, reg, fleet, metrics_port)
            _intel_scenario(kubeconfig, kube_api, reg, fleet)
            _tenstorrent_scenario(kube_api, fleet)
        finally:
            served.stop()
        assert op.proc.poll() is None

    queries = chart_queries(Helm(tmp_path / "render"))
    read = {name for expr in queries.exprs() for name in metric_names(expr)}
    assert len(read) > 5, read
    missing = read - PROMETHEUS_SERIES - served.names
    assert not missing, (
        f"the chart's alerts and dashboard read metrics the operator never served: "
        f"{sorted(missing)}; it served {sorted(served.names)}"
    )

    user = f"system:serviceaccount:{ns}:{account}"
    used, refused = used_and_refused(dev_cluster.log("audit"), user)
    assert not refused, f"the chart's RBAC refused the operator: {refused}"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    cluster_role = json.loads(rbac.read_cluster_role(account, _preload_content=False).data)
    role = json.loads(rbac.read_namespaced_role(account, ns, _preload_content=False).data)
    granted = grants(cluster_role) | grants(role)
    print(f"permissions used by the operator: {sorted(used)}")
    assert justified() <= granted, "docs/security.md justifies permissions the chart lacks"
    assert not justified() & used, (
        f"docs/security.md says these are not exercised, but they were: "
        f"{sorted(justified() & used)}"
    )
    # A watch-list is authorized as a watch alone; where the apiserver serves none, the
    # informers list in pages, so every kind the operator watches needs list as well.
    paged = {(group, resource, "list") for group, resource, verb in used if verb == "watch"}
    unused = granted - used - paged - justified()
    assert not unused, (
        f"granted but never used: {sorted(unused)}; drop them from the chart or justify them "
        "in docs/security.md"
    )


def _module_scenario(
    kubeconfig: str, kube_api: Any, namespace: str, reg: Registry, fleet: Nodes, metrics_port: int
) -> None:
    """A Module: one image pushed, one built, one kernel unmapped; loaded, reported, deleted."""
    core = client.CoreV1Api(kube_api)
    _pull_secret(kube_api, namespace, reg)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "xe-build"}, "data": {"dockerfile": "FROM scratch\n"}}
    )
    reg.push(f"{reg.host}/kmods/rbac:{PUSHED}")
    objects = client.CustomObjectsApi(kube_api)
    builder = Builder(kube_api, namespace, reg)
    builder.start()
    ready = f"kmm.node.kubernetes.io/{namespace}.xe.ready"
    names = fleet.module
    mapped = [n for n in names if not n.endswith("-c0")]
    try:
        objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _module(fleet.tag, reg)
        )
        wait_until(
            lambda: all(ready in (core.read_node(n).metadata.labels or {}) for n in mapped),
            "ready labels on the mapped nodes",
            timeout=90,
        )
    finally:
        builder.stop()
    policy = f"{namespace}/xe"
    metrics = wait_until(
        lambda: (
            (m := _metrics(metrics_port)).get(
                ("kmodkit_nodes", _labels(controller=PLURAL, policy=policy, state="Loaded"))
            )
            == len(mapped)
            and m.get(
                (
                    "kmodkit_jobs_finished_total",
                    _labels(component="module-build", outcome="succeeded"),
                )
            )
            == 1
            and m
        ),
        "metrics: loaded nodes and the finished build",
    )
    assert metrics[("kmodkit_reconcile_total", _labels(controller=PLURAL, result="ok"))] > 0
    assert (
        metrics[("kmodkit_nodes", _labels(controller=PLURAL, policy=policy, state="Unmapped"))] == 1
    )
    every_node = {n.metadata.name for n in core.list_node().items}
    for (name, labels), _ in metrics.items():
        keys = {k for k, _ in labels}
        values = {v for _, v in labels}
        assert not keys & {"node", "node_name", "nodename", "hostname", "instance"}, name
        assert not values & every_node, f"{name} carries a node name: {labels}"

    table = _kubectl(kubeconfig, "kmodkit", "status")
    line = next(ln for ln in table.splitlines() if f"{namespace}/xe" in ln)
    assert "Module" in line and "kmodkit" in line
    assert re.search(rf"loaded={len(mapped)}/\d", line), line
    assert "unmapped=1" in line, line
    node = _kubectl(kubeconfig, "kmodkit", "status", "--node", mapped[0])
    assert ready in node and "ModuleLoaded" in node and PUSHED in node

    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "xe")
    wait_until(
        lambda: _gone(
            lambda: objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "xe")
        ),
        "the Module to be unloaded everywhere and released",
        timeout=60,
    )
    wait_until(
        lambda: (
            ("kmodkit_nodes", _labels(controller=PLURAL, policy=policy, state="Loaded"))
            not in _metrics(metrics_port)
        ),
        "a deleted Module's series to go",
    )


def _columns(kubeconfig: str, name: str, want: str, what: str, timeout: float = 60) -> None:
    """Wait until ``kubectl get clusterpolicy`` shows ``want`` (DP DRA XPU KMM; * for any)."""
    seen: list[list[str]] = []

    def shown() -> bool:
        header, row = _kubectl(kubeconfig, "get", "clusterpolicy", name).splitlines()[:2]
        assert header.split() == ["NAME", "DP", "DRA", "XPU", "KMM", "AGE"]
        seen[:] = [row.split()[1:5]]
        return all(w in ("*", c) for w, c in zip(want.split(), seen[0], strict=True))

    try:
        wait_until(shown, what, timeout=timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}; columns DP DRA XPU KMM: {seen}") from None


def _intel_scenario(kubeconfig: str, kube_api: Any, reg: Registry, fleet: Nodes) -> None:
    """A ClusterPolicy on the built-in engine, through the DRA driver and back, then deleted."""
    ns, nodes = fleet.ns, fleet.intel
    name = f"xe{fleet.tag}"
    module = f"{name}-gpu"
    ready = f"kmm.node.kubernetes.io/{ns}.{module}.ready"
    core = client.CoreV1Api(kube_api)
    apps = client.AppsV1Api(kube_api)
    objects = client.CustomObjectsApi(kube_api)
    _pull_secret(kube_api, ns, reg)
    reg.push(intel._image(reg, name).replace("$KERNEL_FULL_VERSION", PUSHED))
    policy = intel._policy(name, fleet.tag, reg)
    policy["spec"]["resourceMonitoring"] = True
    intel._create(kube_api, policy)
    try:
        created = wait_until(lambda: intel._modules(kube_api, ns).get(module), "the driver Module")
        (owner,) = created["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("ClusterPolicy", name)
        _columns(
            kubeconfig,
            name,
            "2/2 N/A 2/2 2/2",
            "the driver loaded, then the device plugin and XPU Manager on both nodes",
            timeout=90,
        )
        s = intel._status(kube_api, name)
        assert s["engine"] == "Builtin" and s["errors"] == []
        assert all(ready in intel._labels(kube_api, n) for n in nodes)
        assert intel._plugin_nodes(kube_api, ns, name) == sorted(nodes)
        plugin = apps.read_namespaced_daemon_set(device_plugin.name(name), ns)
        assert plugin.spec.template.spec.node_selector[ready] == ""

        # The DRA driver (its RBAC, DeviceClasses and admission policy) replaces the device
        # plugin; XPU Manager watches every GPU through an admin-access ResourceClaimTemplate.
        # Its pods then wait for the scheduler to allocate that claim, which needs the
        # ResourceSlices a kwok node has none of: the DaemonSet's desired count is checked.
        core.patch_namespace(ns, {"metadata": {"labels": {ADMIN_ACCESS: "true"}}})
        intel._patch_spec(kube_api, name, {"resourceRegistration": "dra"})
        _columns(
            kubeconfig, name, "N/A 2/2 * 2/2", "the DRA driver on both nodes, no device plugin"
        )
        assert _owned_by(name, apps.list_namespaced_daemon_set(ns).items) == sorted(
            [dra_driver.name(name), xpu_manager.name(name)]
        )
        assert _gone(lambda: apps.read_namespaced_daemon_set(device_plugin.name(name), ns))
        assert _owned_by(name, _claim_templates(objects, ns))
        assert _owned_by(name, _device_classes(objects))

        # Back to the device plugin without XPU Manager and without the driver: the
        # backend deletes what it no longer plans, its Module included, and the engine
        # unloads the driver everywhere.
        intel._patch_spec(
            kube_api,
            name,
            {"resourceRegistration": "dp", "resourceMonitoring": False, "kernelModule": None},
        )
        wait_until(
            lambda: (
                module not in intel._modules(kube_api, ns)
                and not any(ready in intel._labels(kube_api, n) for n in nodes)
            ),
            "the driver Module deleted and unloaded",
            timeout=90,
        )
        _columns(kubeconfig, name, "2/2 N/A N/A N/A", "the ungated device plugin alone")
        wait_until(
            lambda: (
                not _owned_by(name, _claim_templates(objects, ns))
                and not _owned_by(name, _device_classes(objects))
            ),
            "the DRA driver's and XPU Manager's objects deleted",
        )
        assert _owned_by(name, apps.list_namespaced_daemon_set(ns).items) == [
            device_plugin.name(name)
        ]
    finally:
        intel._delete_policy(kube_api, name)
    wait_until(
        lambda: not _owned_by(name, apps.list_namespaced_daemon_set(ns).items),
        "the policy's device plugin garbage-collected",
        timeout=90,
    )


def _claim_templates(objects: Any, ns: str) -> list[dict[str, Any]]:
    return list(
        objects.list_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaimtemplates"
        )["items"]
    )


def _device_classes(objects: Any) -> list[dict[str, Any]]:
    return list(
        objects.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"]
    )


def _owned_by(policy: str, items: list[Any]) -> list[str]:
    """Names of the objects (dicts or API models) owned by ClusterPolicy ``policy``."""

    def meta(o: Any) -> tuple[str, list[tuple[str, str]]]:
        if isinstance(o, dict):
            m = o["metadata"]
            return m["name"], [(r["kind"], r["name"]) for r in m.get("ownerReferences") or []]
        refs = o.metadata.owner_references or []
        return o.metadata.name, [(r.kind, r.name) for r in refs]

    return sorted(n for n, refs in map(meta, items) if ("ClusterPolicy", policy) in refs)


def _tenstorrent_scenario(kube_api: Any, fleet: Nodes) -> None:
    """ttdp: install, then a bump that rolls every node one at a time; ttfwp: one node flashed."""
    f = fleet.tt
    builder = FakeBuilder(kube_api, f.namespace)
    builder.dkms.add(f.dkms_node)
    firmware = f"fw-{fleet.tag}"
    try:
        create_policy(
            kube_api,
            DRIVER,
            demo_objects.driver_policy(
                f.policy,
                "2.8.0",
                {"ttd-test": fleet.tag},
                upgradePolicy={
                    "drain": {
                        "timeoutSeconds": 10,
                        "podSelectorLabel": f"app={demo_objects.HOLDER_APP}",
                    }
                },
            ),
        )
        wait_until(lambda: _all_at(f, "2.8.0"), "tt-kmd 2.8.0 on the container nodes", timeout=60)
        wait_until(
            lambda: f.status().get("summary", {}).get("upToDate") == 4,
            "status: 3 done + 1 host-managed",
        )
        _holders(f)
        wait_until(
            lambda: (
                len(_running_on(f, f"app={demo_objects.HOLDER_APP}")) == 3
                and len(_running_on(f, "app=tt-telemetry")) == 4
            ),
            "holders and telemetry running",
        )
        holders = {
            p.metadata.uid
            for p in f.core.list_namespaced_pod(
                f.namespace, label_selector=f"app={demo_objects.HOLDER_APP}"
            ).items
        }
        watcher = Watcher(f)
        try:
            patch_policy(kube_api, DRIVER, f.policy, {"spec": {"version": "2.9.0"}})
            wait_until(
                lambda: _all_at(f, "2.9.0") and _uncordoned(f), "2.9.0 everywhere", timeout=120
            )
        finally:
            watcher.stop()
        assert watcher.max_cordoned == 1, "more than one node was upgraded at once"
        assert watcher.cordoned_ever == set(f.nodes), "the DKMS node must not be touched"
        assert watcher.swapped_under_holder == []
        assert watcher.gates_at_swap == ["false"] * 3
        evicted = holders - {
            p.metadata.uid
            for p in f.core.list_namespaced_pod(
                f.namespace, label_selector=f"app={demo_objects.HOLDER_APP}"
            ).items
        }
        assert len(evicted) == 3, "every device holder is evicted before its node's swap"
        assert all(node_labels(kube_api, n)[GATE] == "true" for n in f.all_nodes)
        assert node_labels(kube_api, f.dkms_node).get(KMD) is None

        create_policy(kube_api, FIRMWARE, ttfw._policy(firmware, fleet.tag))
        wait_until(
            lambda: status(kube_api, FIRMWARE, firmware).get("summary", {}).get("upToDate") == 1,
            "the node flashed",
            timeout=60,
        )
        node = f.core.read_node(fleet.firmware)
        assert node.metadata.annotations[ttfw.CURRENT] == "19.9.0.0"
        wait_until(lambda: not f.core.read_node(fleet.firmware).spec.unschedulable, "uncordoned")
        (job,) = ttfw._jobs(kube_api, f.namespace, firmware)
        assert job.status.succeeded == 1
        # forceWrite flashes the node again: the operator replaces the finished Job.
        patch_policy(kube_api, FIRMWARE, firmware, {"spec": {"flasher": {"forceWrite": True}}})
        wait_until(
            lambda: (
                (jobs := ttfw._jobs(kube_api, f.namespace, firmware))
                and jobs[0].metadata.uid != job.metadata.uid
                and jobs[0].status.succeeded == 1
            ),
            "the forced flash's Job in place of the first",
            timeout=60,
        )
        wait_until(
            lambda: status(kube_api, FIRMWARE, firmware)["summary"].get("upToDate") == 1,
            "the node flashed again",
        )
    finally:
        builder.stop()
        delete_policy(kube_api, FIRMWARE, firmware)
        delete_policy(kube_api, DRIVER, f.policy)
    objects = client.CustomObjectsApi(kube_api)
    wait_until(
        lambda: (
            _gone(lambda: objects.get_cluster_custom_object(*DRIVER, f.policy))
            and _gone(lambda: objects.get_cluster_custom_object(*FIRMWARE, firmware))
        ),
        "the Tenstorrent policies released",
    )
    assert not builder.poller.errors, builder.poller.errors


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())
