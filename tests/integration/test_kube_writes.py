"""The engine's per-node writes on the real apiserver, their answers never decoded.

A pod created, a node labelled, an Event posted: the engine makes these for every node of
a fleet, and the client would decode each answer (a whole pod, a whole node) into its
typed models, a millisecond or more of the operator's CPU apiece. Here every write of
``Kube`` and its Event ``Recorder`` runs on a client whose decoder fails the test, and the
writes must still land, refusals still be told apart (with the apiserver's message), and
every connection go back to its pool.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core.runtime.kube import Kube, api_message
from kmodkit.core.runtime.writes import WriteSettings
from kmodkit_dev import cluster as devcluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def undecoding(dev_cluster: devcluster.Cluster) -> Iterator[Any]:
    """A client of its own (its pool is this test's) that fails on decoding any answer."""
    api = devcluster.api_client(dev_cluster)

    def decoded(*_: Any, **__: Any) -> Any:
        raise AssertionError("an answer was decoded into the client's models")

    api.response_deserialize = decoded
    yield api
    api.close()


def _pod(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": "no-such-node",
            "containers": [{"name": "c", "image": "registry.invalid/idle:1"}],
        },
    }


def test_writes_land_undecoded_and_their_connections_are_reused(
    undecoding: Any, kube_api: Any, namespace: str
) -> None:
    core: Any = client.CoreV1Api(kube_api)
    node = core.list_node(label_selector="type=kwok").items[0]
    label = f"writes.kmodkit.io/t-{uuid.uuid4().hex[:8]}"
    kube = Kube(undecoding, WriteSettings(max_in_flight=1))

    kube.create(_pod(namespace, "w"))
    kube.create(_pod(namespace, "w"))  # 409: there already, so done
    with pytest.raises(ApiException) as refused:
        kube.create(_pod(namespace, "Not_A_Name"))
    assert refused.value.status == 422
    assert "Not_A_Name" in api_message(refused.value), "the refusal's message is kept"
    kube.label_node(node.metadata.name, {label: "yes"})
    kube.label_node("no-such-node", {label: "yes"})  # 404: nothing to label
    pod = core.read_namespaced_pod("w", namespace).metadata
    ref = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": "w", "uid": pod.uid}
    assert kube.events.post(ref, "Tested", "an occurrence")  # created
    assert kube.events.post(ref, "Tested", "an occurrence")  # counted up: a patch
    kube.delete_pod(namespace, "w")
    kube.delete_pod(namespace, "w")  # 404: gone already

    labels = core.read_node(node.metadata.name).metadata.labels
    assert labels.get(label) == "yes"
    events = [e for e in core.list_namespaced_event(namespace).items if e.reason == "Tested"]
    assert [e.count for e in events] == [2]
    pods = core.list_namespaced_pod(namespace).items
    assert all(p.metadata.deletion_timestamp for p in pods), "the pod was not deleted"
    pool = undecoding.rest_client.pool_manager.connection_from_url(undecoding.configuration.host)
    assert pool.num_connections == 1, "an answer left unread kept its connection from the pool"
    core.patch_node(node.metadata.name, {"metadata": {"labels": {label: None}}})
