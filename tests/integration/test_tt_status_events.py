"""What a Tenstorrent policy reports about one node on a real control plane, with the real
operator process: a flash pod whose image cannot be pulled shows its own reason and one
Warning Event on the policy and on the node.

Stand-in: kwok pulls no images, so the test writes the kubelet's ImagePullBackOff into the
flash pod's status, as a kubelet would (the pod is labelled to hang, so kwok leaves it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    FIRMWARE,
    STRATEGIC,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

REASON = "FlasherImagePullFailed"


@pytest.fixture
def env(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path: Any
) -> Iterator[tuple[str, str, str]]:
    """The operator's namespace, a node and the name of a firmware policy for it."""
    tag = uuid.uuid4().hex[:6]
    node, policy = f"ttse-{tag}", f"fw-se-{tag}"
    with tt_operator(kubeconfig, kube_api, tmp_path) as (_, namespace):
        add_fleet(dev_cluster, kube_api, [node], {"ttse-test": tag})
        try:
            yield namespace, node, policy
        finally:
            delete_policy(kube_api, FIRMWARE, policy)
            delete_nodes(kube_api, [node])


def _events(core: Any, name: str) -> list[Any]:
    return [
        e
        for e in core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}"
        ).items
        if e.reason == REASON
    ]


def test_a_flasher_image_pull_failure_has_its_reason_and_one_event(
    kube_api: Any, env: tuple[str, str, str]
) -> None:
    namespace, node, policy = env
    core = client.CoreV1Api(kube_api)
    create_policy(
        kube_api,
        FIRMWARE,
        {
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": {"name": policy},
            "spec": {
                "version": "19.9.0",
                "nodeAffinity": {"matchLabels": {"ttse-test": node.removeprefix("ttse-")}},
                "upgradePolicy": {"drain": {"enable": False}},
                "flasher": {"podLabels": {"kmodkit.io/simulate": "hang"}},
            },
        },
    )
    pod = wait_until(
        lambda: next(
            iter(
                core.list_namespaced_pod(
                    namespace, label_selector=f"firmware.tenstorrent.com/cr={policy}"
                ).items
            ),
            None,
        ),
        "the flash pod",
    )
    wait_until(
        lambda: (
            dict(status(kube_api, FIRMWARE, policy).get("nodes", [{}])[0]).get("state")
            == "Flashing"
        ),
        "the node flashing",
    )
    container = pod.spec.containers[0]
    core.patch_namespaced_pod_status(
        pod.metadata.name,
        namespace,
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": container.name,
                        "image": container.image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ImagePullBackOff"}},
                    }
                ]
            }
        },
        _content_type=STRATEGIC,
    )
    entry = wait_until(
        lambda: next(
            (
                n
                for n in status(kube_api, FIRMWARE, policy).get("nodes", [])
                if n["reason"] == REASON
            ),
            None,
        ),
        f"the node reported {REASON}",
    )
    assert entry["state"] == "Flashing" and "ImagePullBackOff" in entry["message"]
    on_policy = wait_until(lambda: _events(core, policy), f"a {REASON} Event on the policy")
    on_node = wait_until(lambda: _events(core, node), f"a {REASON} Event on the node")
    assert on_policy[0].type == "Warning" and node in on_policy[0].message
    assert on_node[0].type == "Warning"
    # The passes that follow (every 5 s while the node is in flight) post nothing more.
    time.sleep(12)
    assert [e.count for e in _events(core, policy)] == [1]
