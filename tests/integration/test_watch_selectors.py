"""A backend's ``Watch`` on the real control plane, through the runtime's own path
(``ResourceController`` registering it, ``Shared`` running its informer): its label and
field selectors are the apiserver's, and an object that stops matching leaves what the
plans see."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import Future
from typing import Any

import kopf
import pytest
from kubernetes import client
from lightkube.config.kubeconfig import KubeConfig
from pydantic import BaseModel

from kmodkit.backends.tenstorrent.flash_pods import UNFINISHED
from kmodkit.core.contract.backend import Plan, Resource, Watch
from kmodkit.core.runtime.informer_http import client_for
from kmodkit.core.runtime.resource_controller import ResourceController
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.schema.crd import CrdSource
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.waiting import wait_until

pytestmark = pytest.mark.cluster
LABEL = "kmodkit.io/watch-test"


class Empty(BaseModel):
    pass


def _pod(name: str, tag: str) -> dict[str, Any]:
    # Bound to a node that does not exist: no kubelet ever touches it, so its phase is the
    # test's to set.
    return {
        "metadata": {"name": name, "labels": {LABEL: tag}},
        "spec": {
            "nodeName": f"nowhere-{tag}",
            "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
        },
    }


def test_a_watch_with_a_field_selector_drops_the_pods_that_finish(
    dev_cluster: devcluster.Cluster, kube_api: Any, namespace: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    core: Any = client.CoreV1Api(kube_api)
    crd = CrdSource("acme.example.com", "v1", "Widget", "widgets", Empty, Empty, "test")
    watch = Watch(
        name="pods",
        group="",
        version="v1",
        plural="pods",
        labels={LABEL: tag},
        field_selector=UNFINISHED,
    )
    resource = Resource(crd=crd, model=Empty, plan=lambda _b, _v: Plan(), watches=(watch,))

    async def api() -> Any:
        return client_for(KubeConfig.from_file(dev_cluster.kubeconfig))

    # No write client: the informers only read, through ``async_api``.
    shared = Shared(kube=None, operator_namespace=namespace, async_api=api)  # type: ignore[arg-type]
    controller = ResourceController("acme", resource, shared)
    controller.register(kopf.OperatorRegistry())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result(60)

    def seen() -> set[str]:
        return {p["metadata"]["name"] for p in controller._watched()["pods"]}

    for name in ("running", "finishing", "failing"):
        core.create_namespaced_pod(namespace, _pod(name, tag))
    core.create_namespaced_pod(namespace, {**_pod("other", tag), "metadata": {"name": "other"}})
    try:
        call(shared.start_informers())
        wait_until(lambda: shared.nodes_synced, "the caches filled")
        wait_until(lambda: seen() == {"running", "finishing", "failing"}, "the labelled pods")
        core.patch_namespaced_pod_status("finishing", namespace, {"status": {"phase": "Succeeded"}})
        core.patch_namespaced_pod_status("failing", namespace, {"status": {"phase": "Failed"}})
        wait_until(lambda: seen() == {"running"}, "the finished pods gone from the view")
        (informer,) = (i for i in shared.informers if i.name.endswith(".watch.pods"))
        assert informer.lists == 1, "leaving the selection is an event, not a relist"
    finally:
        call(shared.stop_informers())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
