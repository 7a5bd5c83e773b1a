"""A driver and a firmware rollout over the same nodes, on a real control plane with the real
operator process: a node is never in flight for both at once, and both finish everywhere.

A watch on the nodes sees every version of every node the apiserver stores, so a moment where
both rollouts had the node in flight cannot slip between two looks. kwok completes the flash
Jobs; ``FakeBuilder`` stands in for the builder entrypoint (no kernel to load a driver into).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from kmodkit.backends.tenstorrent import names
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.states import IN_FLIGHT
from kmodkit_dev.waiting import wait_until
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
    tt_operator,
)

pytestmark = pytest.mark.cluster

KMD = "driver.tenstorrent.com/kmd-version"


class NodeWatch:
    """Every stored version of the fleet's nodes, checked for two rollouts in flight at once."""

    def __init__(self, core: client.CoreV1Api, selector: str, state_labels: dict[str, str]):
        self.state_labels = state_labels
        self.both: list[tuple[str, str]] = []
        """(node, resourceVersion) of every version in flight for both rollouts."""
        self.in_flight_seen: dict[str, set[str]] = {r: set() for r in state_labels}
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()
        self._watch = watch.Watch()
        self._core = core
        self._selector = selector
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._watch.stream(
                self._core.list_node, label_selector=self._selector, timeout_seconds=600
            ):
                self._see(event["object"])
        except Exception as err:  # a test thread must not die silently
            if not self._stopping.is_set():  # stopping cuts the stream mid-read
                self.errors.append(err)

    def _see(self, node: Any) -> None:
        node_labels = node.metadata.labels or {}
        flying = [r for r, key in self.state_labels.items() if node_labels.get(key) in IN_FLIGHT]
        for rollout in flying:
            self.in_flight_seen[rollout].add(node.metadata.name)
        if len(flying) > 1:
            self.both.append((node.metadata.name, node.metadata.resource_version))

    def stop(self) -> None:
        self._stopping.set()
        self._watch.stop()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def env(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    with tt_operator(
        kubeconfig, kube_api, tmp_path_factory.mktemp("ttop"), builders_played=True
    ) as (_, namespace):
        builder = FakeBuilder(kube_api, namespace)
        try:
            yield namespace, uuid.uuid4().hex[:6]
        finally:
            builder.stop()
        assert not builder.poller.errors, builder.poller.errors


def _reasons(kube_api: Any, kind: tuple[str, str, str], policy: str) -> set[str]:
    return {n.get("reason", "") for n in status(kube_api, kind, policy).get("nodes", [])}


def test_driver_and_firmware_never_work_on_one_node_at_once_and_both_finish(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    _, tag = env
    nodes = [f"ttop-{tag}-{i}" for i in range(3)]
    driver, firmware = f"op-{tag}", f"opfw-{tag}"
    selector = {"ttop-test": tag}
    add_fleet(dev_cluster, kube_api, nodes, selector)
    core = client.CoreV1Api(kube_api)
    everywhere = {"maxParallel": 3, "maxUnavailable": "100%", "drain": {"timeoutSeconds": 10}}
    watcher: NodeWatch | None = None
    try:
        create_policy(
            kube_api,
            DRIVER,
            {
                "apiVersion": "driver.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentDriverPolicy",
                "metadata": {"name": driver},
                "spec": {
                    "version": "2.8.0",
                    "nodeAffinity": {"matchLabels": selector},
                    "upgradePolicy": everywhere,
                },
            },
        )
        wait_until(
            lambda: all(node_labels(kube_api, n).get(KMD) == "2.8.0" for n in nodes),
            "tt-kmd 2.8.0 everywhere",
            timeout=90,
        )
        watcher = NodeWatch(
            core,
            f"ttop-test={tag}",
            {
                "driver": RolloutKeys.for_policy(names.driver_policy_id(driver)).state,
                "firmware": RolloutKeys.for_policy(names.firmware_policy_id(firmware)).state,
            },
        )
        # Both rollouts want every node at once, with budgets that would allow it.
        patch_policy(kube_api, DRIVER, driver, {"spec": {"version": "2.9.0"}})
        create_policy(
            kube_api,
            FIRMWARE,
            {
                "apiVersion": "firmware.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentFirmwarePolicy",
                "metadata": {"name": firmware},
                "spec": {
                    "version": "19.9.0",
                    "nodeAffinity": {"matchLabels": selector},
                    "upgradePolicy": {"maxParallel": 3, "maxUnavailable": "100%"},
                },
            },
        )
        busy: set[str] = set()

        def finished() -> bool:
            busy.update(_reasons(kube_api, DRIVER, driver) | _reasons(kube_api, FIRMWARE, firmware))
            return (
                all(node_labels(kube_api, n).get(KMD) == "2.9.0" for n in nodes)
                and status(kube_api, FIRMWARE, firmware).get("summary", {}).get("upToDate") == 3
                and not any(core.read_node(n).spec.unschedulable for n in nodes)
            )

        wait_until(finished, "both rollouts finished on every node", timeout=240)
        watcher.stop()
        assert not watcher.errors, watcher.errors
        assert watcher.both == [], f"in flight for both rollouts at once: {watcher.both}"
        assert watcher.in_flight_seen == {"driver": set(nodes), "firmware": set(nodes)}
        assert "NodeBusy" in busy, f"neither rollout ever waited for the other: {busy}"
        for n in nodes:
            assert HOLDER_ANNOTATION not in (core.read_node(n).metadata.annotations or {}), n
    finally:
        if watcher is not None:
            watcher.stop()
        delete_policy(kube_api, FIRMWARE, firmware)
        delete_policy(kube_api, DRIVER, driver)
        delete_nodes(kube_api, nodes)
