"""``make bench``: speed and memory of the engine, measured (never asserted in tests).

1. The pure loader plan over a large fleet: time per pass and peak memory.
2. The real operator on a devcluster with many kwok nodes: time from applying a
   Module until every node is labelled ready, the operator's peak memory, and
   the node writes it makes once converged (the goal is zero).

Sizes come from BENCH_PLAN_NODES (default 10000) and BENCH_CLUSTER_NODES
(default 500). Results are printed as one JSON object per line.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus, plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.nodes import NodeView
from kmodkit_dev import cluster as devcluster
from kmodkit_dev import registry as devregistry
from kmodkit_dev.nodes import KERNELS, node_manifest
from kmodkit_dev.operator import running_operator

NS = "bench"


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def module_body(image: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kmodkit.io/v1alpha1",
        "kind": "Module",
        "metadata": {"name": "bench", "namespace": NS},
        "spec": {
            "selector": selector,
            "imageRepoSecret": {"name": "pull"},
            "rollout": {"maxUnavailable": "10%"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "bench"},
                    "kernelMappings": [{"regexp": ".", "containerImage": image}],
                }
            },
        },
    }


def bench_plan(n: int) -> None:
    module = Module.model_validate(module_body("r.io/bench:${KERNEL_FULL_VERSION}", {}))
    nodes = [NodeView(f"node-{i:05d}", {"k": "v"}, KERNELS[i % 3], "amd64", True) for i in range(n)]
    settings = LoaderSettings(agent_image="r.io/agent:1")
    images = {f"r.io/bench:{k}": ImageStatus(ImageState.EXISTS) for k in KERNELS}
    tracemalloc.start()
    started = time.perf_counter()
    first = plan(module, nodes, [], images, settings)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    report(
        bench="loader_plan",
        nodes=n,
        seconds=round(elapsed, 3),
        peak_mib=round(peak / 2**20, 1),
        pods_planned=len(first.create),
    )


def _rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def bench_cluster(n: int) -> None:
    from kubernetes import client, watch

    untyped_watch: Any = watch  # the watch module has no type hints

    name = f"bench-{os.getpid()}"
    c = devcluster.up(name, nodes=0)
    work = Path(tempfile.mkdtemp(prefix="kmodkit-bench-"))
    reg = devregistry.start(work / "registry", "bench", secrets.token_urlsafe(12), pki_dir=c.pki)
    try:
        started = time.monotonic()
        devcluster.add_nodes(
            c,
            [node_manifest(f"b-{i:05d}", KERNELS[i % 3], {"bench": "yes"}) for i in range(n)],
            echo=lambda _m: None,
        )
        report(bench="kwok_nodes_ready", nodes=n, seconds=round(time.monotonic() - started, 1))
        api = devcluster.api_client(c)
        core: Any = client.CoreV1Api(api)

        from tests.integration.crds_util import install

        install(api)
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_secret(NS, reg.pull_secret("pull"))
        for k in KERNELS:
            reg.push(f"{reg.host}/bench:{k}")
        ready = f"kmm.node.kubernetes.io/{NS}.bench.ready"
        with running_operator(
            c.kubeconfig, work / "operator.log", KMODKIT_REGISTRY_CA=str(c.pki / "ca.crt")
        ) as op:
            started = time.monotonic()
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "kmodkit.io",
                "v1alpha1",
                NS,
                "modules",
                module_body(f"{reg.host}/bench:${{KERNEL_FULL_VERSION}}", {"bench": "yes"}),
            )
            while len(core.list_node(label_selector=ready).items) < n:
                time.sleep(1)
            report(
                bench="module_loaded_fleet",
                nodes=n,
                seconds=round(time.monotonic() - started, 1),
                operator_peak_rss_mib=_rss_peak_mib(op.proc.pid),
            )
            # Converged: count label/spec writes to nodes for a while (goal: none).
            writes = [0]
            stop = threading.Event()

            def count() -> None:
                w: Any = untyped_watch.Watch()
                rv = core.list_node().metadata.resource_version
                for ev in w.stream(core.list_node, resource_version=rv, timeout_seconds=30):
                    if stop.is_set():
                        break
                    labels = ev["object"].metadata.labels or {}
                    if ev["type"] == "MODIFIED" and ready not in labels:
                        writes[0] += 1

            t = threading.Thread(target=count, daemon=True)
            t.start()
            t.join(timeout=35)
            stop.set()
            report(bench="idle_node_writes_30s", nodes=n, writes=writes[0])
    finally:
        reg.stop()
        devcluster.down(name, echo=lambda _m: None)


def main() -> None:
    bench_plan(int(os.environ.get("BENCH_PLAN_NODES", "10000")))
    bench_cluster(int(os.environ.get("BENCH_CLUSTER_NODES", "500")))


if __name__ == "__main__":
    main()
