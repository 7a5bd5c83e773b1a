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
import base64
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from devcluster import build, cluster
from devcluster import registry as devregistry
from devcluster.operator import running_operator

NAME = "demo"
NS = "kmodkit-demo"
KERNEL_PUSHED, KERNEL_BUILT = "6.8.0-45-generic", "7.0.0-14-generic"
# kwok runs no build, so the Dockerfile's content never matters here.
XE_DOCKERFILE = "FROM scratch\n"


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def wait(what: str, probe: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.5)
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
    from kubernetes import client

    from core.crdgen import generated_documents

    ext: Any = client.ApiextensionsV1Api(api)
    adm: Any = client.AdmissionregistrationV1Api(api)
    opts = {
        "field_manager": "kmodkit-demo",
        "force": True,
        "_content_type": "application/apply-patch+yaml",
    }
    for docs in generated_documents().values():
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc["kind"] == "CustomResourceDefinition":
                ext.patch_custom_resource_definition(name, doc, **opts)
            elif doc["kind"] == "ValidatingAdmissionPolicy":
                adm.patch_validating_admission_policy(name, doc, **opts)
            elif doc["kind"] == "ValidatingAdmissionPolicyBinding":
                adm.patch_validating_admission_policy_binding(name, doc, **opts)


def play_builder(d: Demo, reg: devregistry.Registry, stop: threading.Event) -> None:
    """Push the image each new build Job names (kwok completes the Job itself)."""
    from kubernetes import client, watch

    batch: Any = client.BatchV1Api(d.api)
    seen: set[str] = set()
    while not stop.is_set():
        for ev in watch.Watch().stream(batch.list_namespaced_job, NS, timeout_seconds=5):
            job = ev["object"]
            image = (job.metadata.annotations or {}).get("kmodkit.io/image")
            if image and job.metadata.name not in seen:
                seen.add(job.metadata.name)
                print(f"    build Job {job.metadata.name} runs (simulated); pushing {image}")
                reg.push(image)


def module(reg: devregistry.Registry, version: str) -> dict[str, Any]:
    image = f"{reg.host}/drivers/xe:{version}-${{KERNEL_FULL_VERSION}}"
    return {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": "xe", "namespace": NS},
        "spec": {
            "selector": {"intel.feature.node.kubernetes.io/gpu-pci": "true"},
            "imageRepoSecret": {"name": "registry"},
            "rollout": {"maxUnavailable": 1},
            "moduleLoader": {
                "container": {
                    "version": version,
                    "modprobe": {
                        "moduleName": "xe",
                        "firmwarePath": "/firmware",
                        "modulesLoadingOrder": ["xe", "drm_gpuvm", "drm_exec"],
                    },
                    "inTreeModulesToRemove": ["xe"],
                    "kernelMappings": [
                        {"literal": KERNEL_PUSHED, "containerImage": image},
                        {
                            "regexp": r"^7\.0\.0-[0-9]+-generic$",
                            "containerImage": image,
                            "build": {
                                "dockerfileConfigMap": {"name": "xe-build"},
                                "buildArgs": [{"name": "XE_VERSION", "value": version}],
                            },
                        },
                    ],
                }
            },
        },
    }


def run_demo(d: Demo, reg: devregistry.Registry, port: int) -> None:
    ready = f"kmm.node.kubernetes.io/{NS}.xe.ready"
    vready = f"kmm.node.kubernetes.io/{NS}.xe.version.ready"
    want = f"kmm.node.kubernetes.io/version-module.{NS}.xe"
    intel = [
        n.metadata.name
        for n in d.core.list_node(
            label_selector="intel.feature.node.kubernetes.io/gpu-pci=true"
        ).items
    ]
    loadable = [
        n
        for n in intel
        if d.core.read_node(n).status.node_info.kernel_version in (KERNEL_PUSHED, KERNEL_BUILT)
    ]

    step("a Module for the Xe driver: one kernel's image is in the registry, one is built")
    reg.push(f"{reg.host}/drivers/xe:v1-{KERNEL_PUSHED}")
    for n in intel:
        d.core.patch_node(n, {"metadata": {"labels": {want: "v1"}}})
    d.objs.create_namespaced_custom_object(
        "kmodkit.io", "v1alpha1", NS, "modules", module(reg, "v1")
    )
    wait(
        "the module loaded on every Intel node with a mapped kernel",
        lambda: all(ready in d.labels(n) for n in loadable),
    )
    d.kubectl("get", "kmod", "-n", NS)
    d.kubectl("get", "pods", "-n", NS, "-o", "wide")
    d.kubectl(
        "get",
        "nodes",
        "-l",
        "intel.feature.node.kubernetes.io/gpu-pci=true",
        "-L",
        f"{ready},{vready}",
    )
    step("nodes the Module cannot serve are reported by name")
    d.kubectl(
        "get",
        "kmod",
        "xe",
        "-n",
        NS,
        "-o",
        "jsonpath={range .status.nodeFailures[*]}{.node}{': '}{.reason}{' - '}"
        "{.message}{'\\n'}{end}",
    )

    step("ordered upgrade: v2 is published, then one node is moved to it with kubectl label")
    reg.push(f"{reg.host}/drivers/xe:v2-{KERNEL_PUSHED}")
    d.objs.patch_namespaced_custom_object(
        "kmodkit.io", "v1alpha1", NS, "modules", "xe", {"spec": module(reg, "v2")["spec"]}
    )
    first = loadable[0]
    print(f"    kubectl label node {first} {want}=v2 --overwrite")
    d.kubectl("label", "node", first, f"{want}=v2", "--overwrite")
    wait(f"{first} to run v2", lambda: d.labels(first).get(vready) == "v2")
    d.kubectl(
        "get",
        "nodes",
        "-l",
        "intel.feature.node.kubernetes.io/gpu-pci=true",
        "-L",
        f"{want},{vready}",
    )
    print(f"\n    operator health: http://127.0.0.1:{port}/healthz")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()

    step(f"starting a local control plane with {args.nodes} kwok nodes")
    c = cluster.up(NAME, nodes=args.nodes, profile="mixed")
    d = Demo(c)
    reg = devregistry.start(c.dir / "registry", "demo", secrets.token_urlsafe(12), pki_dir=c.pki)
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
        d.core.create_namespace({"metadata": {"name": NS}})
        d.core.create_namespaced_secret(
            NS,
            {
                "metadata": {"name": "registry"},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {
                    ".dockerconfigjson": base64.b64encode(reg.dockerconfigjson().encode()).decode()
                },
            },
        )
        d.core.create_namespaced_config_map(
            NS, {"metadata": {"name": "xe-build"}, "data": {"dockerfile": XE_DOCKERFILE}}
        )
        log = c.dir / "logs" / "operator.log"
        print(f"    operator log: {log}")
        threading.Thread(target=play_builder, args=(d, reg, stop), daemon=True).start()
        with running_operator(
            c.kubeconfig, log, KMODKIT_REGISTRY_CA=str(c.pki / "ca.crt")
        ) as operator:
            run_demo(d, reg, operator.port)
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
