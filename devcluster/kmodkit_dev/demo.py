"""``make demo``: kmodkit on a local simulated fleet.

A real control plane (etcd, kube-apiserver, controller-manager, scheduler)
with kwok nodes on three kernels, a real OCI registry with auth and TLS, and
the kmodkit operator. kwok runs no containers: pods only report Running/Ready
and build Jobs complete without pushing, so the demo pushes the image a build
would have pushed. Everything else — builds planned once per image, loader
pods per node, readiness labels, ordered upgrades — is the operator at work.
Ends by stopping everything (``--keep`` leaves the cluster up).
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kmodkit_dev import build, cluster, manifests, realnode_demo, tenstorrent_demo
from kmodkit_dev import registry as devregistry
from kmodkit_dev.operator import running_operator
from kmodkit_dev.repo import ROOT
from kmodkit_dev.waiting import wait_until

NAME = "demo"
NS = "kmodkit-system"  # the operator's namespace
KERNEL_PUSHED, KERNEL_BUILT = "6.8.0-45-generic", "7.0.0-14-generic"


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def wait(what: str, probe: Callable[[], bool], timeout: float = 120) -> None:
    wait_until(probe, what, timeout=timeout, interval=0.5)
    print(f"    ok: {what}")


class Demo:
    def __init__(self, c: cluster.Cluster) -> None:
        from kubernetes import client

        self.c = c
        self.api = cluster.api_client(c)
        self.core: Any = client.CoreV1Api(self.api)
        self.objs: Any = client.CustomObjectsApi(self.api)

    def kubectl(self, *args: str) -> None:
        subprocess.run(
            [str(build.binary("kubectl")), f"--kubeconfig={self.c.kubeconfig}", *args], check=True
        )

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.core.read_node(node).metadata.labels or {})


def install_crds(api: Any) -> None:
    from kmodkit.core.cli.crds import generated_documents

    manifests.install(api, (d for docs in generated_documents().values() for d in docs))


def play_builder(d: Demo, reg: devregistry.Registry, stop: threading.Event) -> None:
    """Push the image each new build Job names (kwok completes the Job itself)."""
    from kubernetes import client, watch

    batch: Any = client.BatchV1Api(d.api)
    untyped_watch: Any = watch  # the watch module has no type hints
    seen: set[str] = set()
    while not stop.is_set():
        for ev in untyped_watch.Watch().stream(batch.list_namespaced_job, NS, timeout_seconds=5):
            job = ev["object"]
            image = (job.metadata.annotations or {}).get("kmodkit.io/image")
            if image and job.metadata.name not in seen:
                seen.add(job.metadata.name)
                print(f"    build Job {job.metadata.name} runs (simulated); pushing {image}")
                reg.push(image)


POLICY = "gpu"
MODULE = f"{POLICY}-gpu"  # the Module a ClusterPolicy emits
INTEL = "intel.feature.node.kubernetes.io/gpu-pci=true"


def cluster_policy(reg: devregistry.Registry, version: str) -> dict[str, Any]:
    image = f"{reg.host}/intel/xe-oot-kmd:{version}-$KERNEL_FULL_VERSION"
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "ClusterPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "resourceRegistration": "dp",
            "pullSecret": {"name": "registry"},
            "nodeSelector": {"intel.feature.node.kubernetes.io/gpu-pci": "true"},
            "kernelModule": {
                "moduleName": "xe",
                "version": version,
                "firmwarePath": "/firmware",
                "modulesLoadingOrder": ["xe", "drm_gpuvm", "drm_exec"],
                "kernelMappings": [
                    {"regexp": r"^6\.8\.0-[0-9]+-generic$", "containerImage": image},
                    {
                        "regexp": r"^7\.0\.0-[0-9]+-generic$",
                        "containerImage": image,
                        "build": {
                            "dockerfileConfigMap": {"name": "xe-build-u26.04"},
                            "buildArgs": [{"name": "XE_TAG", "value": f"xebr_{version}"}],
                        },
                    },
                ],
            },
        },
    }


def run_demo(d: Demo, reg: devregistry.Registry, port: int) -> None:
    ready = f"kmm.node.kubernetes.io/{NS}.{MODULE}.ready"
    vready = f"kmm.node.kubernetes.io/{NS}.{MODULE}.version.ready"
    want = f"kmm.node.kubernetes.io/version-module.{NS}.{MODULE}"
    intel = [n.metadata.name for n in d.core.list_node(label_selector=INTEL).items]
    kernels = {n: d.core.read_node(n).status.node_info.kernel_version for n in intel}
    loadable = [n for n in intel if kernels[n] in (KERNEL_PUSHED, KERNEL_BUILT)]

    step(
        "Intel: a ClusterPolicy for the out-of-tree Xe driver (one kernel's image is in the "
        "registry, the other's is built in-cluster)"
    )
    reg.push(f"{reg.host}/intel/xe-oot-kmd:v1-{KERNEL_PUSHED}")
    print(f"    kubectl label nodes -l {INTEL} {want}=v1")
    d.kubectl("label", "nodes", "-l", INTEL, f"{want}=v1", "--overwrite")
    d.objs.create_cluster_custom_object(
        "intel.com", "v1alpha1", "clusterpolicies", cluster_policy(reg, "v1")
    )
    wait(
        "the driver loaded on every Intel node with a mapped kernel",
        lambda: all(ready in d.labels(n) for n in loadable),
    )
    wait("the device plugin on every ready node", lambda: _dp_nodes(d) == set(loadable))
    d.kubectl("get", "clusterpolicy")
    d.kubectl("get", "kmod", "-n", NS)
    d.kubectl("get", "pods", "-n", NS, "-o", "wide")
    print(f"    nodes labelled {ready} (the device plugin selects on it):")
    d.kubectl("get", "nodes", "-l", ready, "-L", vready)
    step("nodes the driver cannot serve are reported by name")
    d.kubectl(
        "get",
        "kmod",
        MODULE,
        "-n",
        NS,
        "-o",
        "jsonpath={range .status.nodeFailures[*]}{.node}{': '}{.reason}{' - '}"
        "{.message}{'\\n'}{end}",
    )

    step("ordered upgrade: v2 is published, then one node is moved to it with kubectl label")
    reg.push(f"{reg.host}/intel/xe-oot-kmd:v2-{KERNEL_PUSHED}")
    d.objs.patch_cluster_custom_object(
        "intel.com",
        "v1alpha1",
        "clusterpolicies",
        POLICY,
        {"spec": {"kernelModule": cluster_policy(reg, "v2")["spec"]["kernelModule"]}},
    )
    first = loadable[0]
    print(f"    kubectl label node {first} {want}=v2 --overwrite")
    d.kubectl("label", "node", first, f"{want}=v2", "--overwrite")
    wait(f"{first} to run v2", lambda: d.labels(first).get(vready) == "v2")
    d.kubectl("get", "nodes", "-l", INTEL, "-L", f"{want},{vready}")
    print(f"\n    operator health: http://127.0.0.1:{port}/healthz")


TT = "feature.node.kubernetes.io/pci-1200_1e52.present"


def play_tt_builder(d: Demo, nodes: set[str], dkms: set[str], stop: threading.Event) -> None:
    """Write the node labels each builder pod on one of the kwok ``nodes`` would (kwok runs
    nothing inside pods; on the real node the builder writes its own)."""
    from kmodkit_dev.tenstorrent_demo import builder_report

    seen: set[str] = set()
    while not stop.wait(0.5):
        for pod in d.core.list_namespaced_pod(
            NS, label_selector="app.kubernetes.io/name=tt-kmd-installer"
        ).items:
            node = pod.spec.node_name
            if pod.metadata.uid in seen or pod.status.phase != "Running" or node not in nodes:
                continue
            seen.add(pod.metadata.uid)
            env = {e.name: e.value for e in pod.spec.containers[0].env or []}
            report = builder_report(env["TT_KMD_VERSION"], node in dkms)
            d.core.patch_node(node, {"metadata": {"labels": dict(report)}})


def most_cordoned(d: Demo, nodes: list[str], done: Callable[[], bool]) -> int:
    """Watch until ``done``; returns the most of ``nodes`` cordoned at once."""
    worst = 0
    while not done():
        cordoned = sum(1 for n in nodes if d.core.read_node(n).spec.unschedulable)
        worst = max(worst, cordoned)
        time.sleep(0.2)
    return worst


def run_tenstorrent(d: Demo) -> None:
    from kubernetes import client

    from kmodkit.backends.tenstorrent import keys
    from kmodkit.backends.tenstorrent.names import driver_policy_id, firmware_policy_id
    from kmodkit.core.rollout.keys import RolloutKeys
    from kmodkit_dev import tenstorrent_demo as tt

    nodes = sorted(n.metadata.name for n in d.core.list_node(label_selector=f"{TT}=true").items)
    dkms = set(nodes[:2])
    gate = "tenstorrent.com/deploy.tt-telemetry"
    state = RolloutKeys.for_policy(driver_policy_id("fleet")).state
    apps: Any = client.AppsV1Api(d.api)
    step(
        f"Tenstorrent: {len(nodes)} nodes; {', '.join(sorted(dkms))} still have DKMS "
        "(host mode); inference pods hold /dev/tenstorrent on two nodes"
    )
    for n in nodes:
        d.core.patch_node(n, {"metadata": {"labels": {gate: "true"}}})
    apps.create_namespaced_daemon_set(NS, tt.telemetry_daemonset({TT: "true"}))
    for n in nodes[2:4]:
        apps.create_namespaced_deployment(NS, tt.device_holder(n))
    stop = threading.Event()
    threading.Thread(target=play_tt_builder, args=(d, set(nodes), dkms, stop), daemon=True).start()
    try:
        d.objs.create_cluster_custom_object(
            "driver.tenstorrent.com",
            "v1alpha1",
            "tenstorrentdriverpolicies",
            tt.driver_policy("fleet", "2.8.0", {TT: "true"}),
        )
        wait("tt-kmd 2.8.0 on every container-managed node", lambda: _ttdp(d, "2.8.0"))
        d.kubectl("get", "ttdp")
        d.kubectl(
            "get",
            "nodes",
            "-l",
            f"{TT}=true",
            "-L",
            f"{keys.TT_INSTALL_MODE_LABEL},{keys.TT_KMD_VERSION_LABEL}",
        )

        step(
            "upgrade to 2.9.0: one node at a time — cordon, gate telemetry off, evict the "
            "device holders, drain, swap, validate, give the node back"
        )
        d.objs.patch_cluster_custom_object(
            "driver.tenstorrent.com",
            "v1alpha1",
            "tenstorrentdriverpolicies",
            "fleet",
            {"spec": {"version": "2.9.0"}},
        )
        worst = most_cordoned(d, nodes, lambda: _ttdp(d, "2.9.0"))
        print(f"    ok: every node on 2.9.0; never more than {worst} node cordoned at once")
        d.kubectl("get", "ttdp")
        d.kubectl(
            "get",
            "nodes",
            "-l",
            f"{TT}=true",
            "-L",
            f"{keys.TT_KMD_VERSION_LABEL},{gate},{state}",
        )

        step("firmware: a ttfwp flashes every Tenstorrent node, two at a time")
        fw_state = RolloutKeys.for_policy(firmware_policy_id("fw")).state
        d.objs.create_cluster_custom_object(
            "firmware.tenstorrent.com",
            "v1alpha1",
            "tenstorrentfirmwarepolicies",
            tt.firmware_policy("fw", "19.4.0", {TT: "true"}, upgradePolicy={"maxParallel": 2}),
        )
        worst = most_cordoned(d, nodes, lambda: _ttfwp_done(d))
        print(f"    ok: flashed; never more than {worst} nodes cordoned at once")
        d.kubectl("get", "ttfwp")
        d.kubectl("get", "nodes", "-l", f"{TT}=true", "-L", fw_state)
    finally:
        stop.set()


def _ttdp(d: Demo, version: str) -> bool:
    obj = d.objs.get_cluster_custom_object(
        "driver.tenstorrent.com", "v1alpha1", "tenstorrentdriverpolicies", "fleet"
    )
    status = obj.get("status") or {}
    summary = status.get("summary") or {}
    return (
        status.get("desiredVersion") == version
        and summary.get("inProgress") == 0
        and 0 < summary.get("matched", 0) == summary.get("upToDate", 0)
    )


def _ttfwp_done(d: Demo) -> bool:
    obj = d.objs.get_cluster_custom_object(
        "firmware.tenstorrent.com", "v1alpha1", "tenstorrentfirmwarepolicies", "fw"
    )
    summary = (obj.get("status") or {}).get("summary") or {}
    return bool(0 < summary.get("matched", 0) == summary.get("upToDate", 0))


def _dp_nodes(d: Demo) -> set[str]:
    pods = d.core.list_namespaced_pod(NS).items
    return {
        p.spec.node_name
        for p in pods
        if "device-plugin" in p.metadata.name and p.status.phase == "Running"
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="also a real kubelet node in a qemu VM, and the Tenstorrent flows run on it",
    )
    args = parser.parse_args()

    with_real = " and a real node (a kubelet in a qemu VM)" if args.real_node else ""
    step(f"starting a local control plane with {args.nodes} kwok nodes{with_real}")
    c = cluster.up(NAME, nodes=args.nodes, profile="mixed", real_node=args.real_node)
    d = Demo(c)
    reg = devregistry.start(c.dir / "registry", "demo", secrets.token_urlsafe(12), pki_dir=c.pki)
    # Recorded with the cluster's processes, so `kmodkit dev down` stops it too.
    c.pids["registry"] = reg.pid
    c.save()
    stop = threading.Event()
    try:
        step("the simulated fleet: accelerators and kernels")
        d.kubectl(
            "get",
            "nodes",
            "-o",
            "wide",
            "-L",
            "intel.feature.node.kubernetes.io/gpu-pci,"
            "feature.node.kubernetes.io/pci-1200_1e52.present",
        )

        step("installing the CRDs and starting the kmodkit operator")
        install_crds(d.api)
        d.core.create_namespace(
            {
                "metadata": {
                    "name": NS,
                    "labels": {
                        "kmodkit.io/operator-namespace": "true",
                        "pod-security.kubernetes.io/enforce": "privileged",
                    },
                }
            }
        )
        d.core.create_namespaced_secret(NS, reg.pull_secret("registry"))
        d.core.create_namespaced_service_account(NS, tenstorrent_demo.flasher_account())
        d.kubectl(
            "apply", "-n", NS, "-f", str(ROOT / "docs" / "samples" / "xe-build-configmap.yaml")
        )
        log = c.dir / "logs" / "operator.log"
        print(f"    operator log: {log}")
        threading.Thread(target=play_builder, args=(d, reg, stop), daemon=True).start()
        settings: dict[str, Any] = {
            "KMODKIT_REGISTRY_CA": str(c.pki / "ca.crt"),
            "KMODKIT_NAMESPACE": NS,
            # The demo namespace's default account stands in for the chart's.
            "KMODKIT_TT_SERVICE_ACCOUNT": "default",
            "KMODKIT_TT_FLASHER_SERVICE_ACCOUNT": tenstorrent_demo.FLASHER_ACCOUNT,
        }
        if args.real_node:
            settings |= realnode_demo.prepare(c, d.api, NS, print)
        with running_operator(c.kubeconfig, log, **settings) as operator:
            run_demo(d, reg, operator.port)
            run_tenstorrent(d)
            if args.real_node:
                realnode_demo.run(d, step, wait)
            code = operator.stop()
        step(f"operator stopped cleanly (exit {code})")
        return 0 if code == 0 else 1
    finally:
        stop.set()
        if args.keep:
            print(
                f"\ncluster left running: export KUBECONFIG={c.kubeconfig}; "
                f"stop it with: kmodkit dev down --name {NAME}"
            )
        else:
            reg.stop()
            cluster.down(NAME)


if __name__ == "__main__":
    sys.exit(main())
