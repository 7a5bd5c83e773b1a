"""The raw apiserver baseline: the writes any controller must make for a fleet, done directly.

One pod pinned to each node, waited on until kwok reports it Ready, then one label
patched on each node, from 32 client threads. The operator's convergence is measured
against this in the same run, on the same cluster, so the ratio says what the
operator adds, not how fast the machine is.

The pod is ``minimal_pod`` (one container: the baseline the convergence goal is set
against) unless the caller gives another: the bench also runs it with the operator's
own loader pods, so that what the pods' size costs the apiserver and kwok is told apart
from what the operator adds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kmodkit.core.rollout.observed import is_ready

THREADS = 32
NAMESPACE = "bench-baseline"
LABEL = "bench.kmodkit.io/baseline"


def minimal_pod(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"raw-{node}"},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.invalid/raw:1"}],
        },
    }


def run(api: Any, nodes: list[str], pod: Callable[[str], dict[str, Any]] = minimal_pod) -> float:
    """Seconds from the first pod create to the last label; the pods (``pod(node)``,
    named ``raw-<node>``) are left for ``clean`` (deleting them is no part of what is
    measured).

    Every answer is read as plain JSON: the client's models would cost this process
    (and so the two cores it shares with the apiserver and kwok) more than the writes.
    """
    core: Any = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    # A pod is refused until the controller-manager made the namespace's default account.
    while not core.list_namespaced_service_account(
        NAMESPACE, field_selector="metadata.name=default"
    ).items:
        time.sleep(0.1)
    untyped: Any = watch
    label = {"metadata": {"labels": {LABEL: "true"}}}
    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        list(
            pool.map(
                lambda n: (
                    core.create_namespaced_pod(NAMESPACE, pod(n), _preload_content=False).data
                ),
                nodes,
            )
        )
        listed = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)
        ready = {p["spec"]["nodeName"] for p in listed["items"] if is_ready(p)}
        stream = untyped.Watch().stream(
            core.list_namespaced_pod,
            NAMESPACE,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=600,
            deserialize=False,
        )
        for event in stream if len(ready) < len(nodes) else ():
            if is_ready(event["object"]):
                ready.add(event["object"]["spec"]["nodeName"])
                if len(ready) == len(nodes):
                    break
        list(pool.map(lambda n: core.patch_node(n, label, _preload_content=False).data, nodes))
    return time.monotonic() - started


def clean(api: Any) -> None:
    """The baseline's pods go with their namespace, so the operator's run is not slowed."""
    core: Any = client.CoreV1Api(api)
    while True:
        try:
            # The answer lists every pod deleted: read raw, not decoded into models.
            core.delete_collection_namespaced_pod(
                NAMESPACE, grace_period_seconds=0, _preload_content=False
            ).read()
            break
        except ApiException as err:
            # 10,000 pods can outlast the apiserver's request timeout (504); what it
            # deleted stays deleted, and the next call deletes the rest.
            if err.status != 504:
                raise
    core.delete_namespace(NAMESPACE)
    while any(n.metadata.name == NAMESPACE for n in core.list_namespace().items):
        time.sleep(1)
