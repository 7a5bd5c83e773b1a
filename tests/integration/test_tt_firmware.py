"""The Tenstorrent firmware policy on a real control plane, with the real operator process.

kwok completes flash Job pods; a pod labelled kmodkit.io/simulate=fail fails
and one labelled simulate=hang never finishes (the Job's deadline fails it).
Checks: at most maxParallel nodes in flight, one Job per (policy, node,
version), nodes remember what they run (deleting the Jobs flashes nothing
again), forceWrite re-flashes exactly once, a failed flash halts the rollout,
a hung flash fails at flashTimeoutSeconds, and the seeds' manifests apply.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit.backends.tenstorrent import names
from kmodkit.sdk import RolloutKeys
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    DRIVER,
    FIRMWARE,
    FLASHER_ACCOUNT,
    Poller,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    patch_policy,
    status,
    tt_operator,
)

pytestmark = pytest.mark.cluster

FLASH_SELECTOR = "app.kubernetes.io/name=tt-flasher"
CURRENT = "firmware.tenstorrent.com/current-version"


def _policy(name: str, tag: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "firmware.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentFirmwarePolicy",
        "metadata": {"name": name},
        "spec": {"version": "19.9.0", "nodeAffinity": {"matchLabels": {"ttf-test": tag}}, **spec},
    }


@pytest.fixture(scope="module")
def env(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    with tt_operator(kubeconfig, kube_api, tmp_path_factory.mktemp("ttf")) as (_, namespace):
        yield namespace, uuid.uuid4().hex[:6]


def _jobs(kube_api: Any, namespace: str, policy: str) -> list[Any]:
    return (
        client.BatchV1Api(kube_api)
        .list_namespaced_job(namespace, label_selector=f"firmware.tenstorrent.com/cr={policy}")
        .items
    )


def _states(kube_api: Any, policy: str) -> dict[str, tuple[str, str]]:
    return {
        n["name"]: (n["state"], n["reason"])
        for n in status(kube_api, FIRMWARE, policy).get("nodes", [])
    }


def test_max_parallel_durable_done_and_force_write_once(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    namespace, tag = env
    nodes = [f"ttf-{tag}-{i}" for i in range(4)]
    policy = f"fw-{tag}"
    add_fleet(dev_cluster, kube_api, nodes, {"ttf-test": tag})
    core = client.CoreV1Api(kube_api)
    seen = {"max": 0}

    def tick() -> None:
        cordoned = [
            n
            for n in core.list_node(label_selector=f"ttf-test={tag}").items
            if n.spec.unschedulable
        ]
        seen["max"] = max(seen["max"], len(cordoned))

    watcher = Poller(tick, 0.1)
    try:
        create_policy(kube_api, FIRMWARE, _policy(policy, tag, upgradePolicy={"maxParallel": 2}))
        wait_until(
            lambda: status(kube_api, FIRMWARE, policy).get("summary", {}).get("upToDate") == 4,
            "every node flashed",
            timeout=120,
        )
        wait_until(
            lambda: (
                not any(
                    n.spec.unschedulable
                    for n in core.list_node(label_selector=f"ttf-test={tag}").items
                )
            ),
            "nodes uncordoned",
        )
        watcher.stop()
        assert not watcher.errors
        assert 1 <= seen["max"] <= 2
        assert all(core.read_node(n).metadata.annotations[CURRENT] == "19.9.0.0" for n in nodes)
        jobs = _jobs(kube_api, namespace, policy)
        assert len(jobs) == 4
        assert {j.spec.active_deadline_seconds for j in jobs} == {900}
        # The flasher needs no API access: its own account, and no token mounted.
        pod_specs = [j.spec.template.spec for j in jobs]
        assert {p.service_account_name for p in pod_specs} == {FLASHER_ACCOUNT}
        assert {p.automount_service_account_token for p in pod_specs} == {False}
        s = status(kube_api, FIRMWARE, policy)
        assert {c["type"]: c["reason"] for c in s["conditions"]}["Ready"] == "AllUpToDate"

        # Finished Jobs go away (their TTL); the nodes remember: nothing is flashed again.
        batch = client.BatchV1Api(kube_api)
        for job in jobs:
            batch.delete_namespaced_job(
                job.metadata.name, namespace, propagation_policy="Background"
            )
        wait_until(lambda: not _jobs(kube_api, namespace, policy), "Jobs deleted")
        patch_policy(kube_api, FIRMWARE, policy, {"spec": {"upgradePolicy": {"maxParallel": 3}}})
        wait_until(
            lambda: status(kube_api, FIRMWARE, policy).get("observedGeneration") == 2,
            "the edit observed",
        )
        assert not _jobs(kube_api, namespace, policy)
        assert status(kube_api, FIRMWARE, policy)["summary"]["upToDate"] == 4

        # forceWrite re-flashes every node once, and only once.
        patch_policy(kube_api, FIRMWARE, policy, {"spec": {"flasher": {"forceWrite": True}}})
        wait_until(
            lambda: len([j for j in _jobs(kube_api, namespace, policy) if j.status.succeeded]) == 4,
            "four forced flashes",
            timeout=120,
        )
        wait_until(
            lambda: status(kube_api, FIRMWARE, policy)["summary"]["upToDate"] == 4, "done again"
        )
        env_of = {
            e.name: e.value
            for e in _jobs(kube_api, namespace, policy)[0].spec.template.spec.containers[0].env
        }
        assert env_of["TT_FORCE_WRITE"] == "true"
        assert env_of["HTTPS_PROXY"] == "http://proxy.example:3128"
        names = {j.metadata.uid for j in _jobs(kube_api, namespace, policy)}
        patch_policy(kube_api, FIRMWARE, policy, {"spec": {"upgradePolicy": {"maxParallel": 1}}})
        wait_until(
            lambda: status(kube_api, FIRMWARE, policy).get("observedGeneration") == 4,
            "the edit observed",
        )
        assert {j.metadata.uid for j in _jobs(kube_api, namespace, policy)} == names
    finally:
        watcher.stop()
        delete_policy(kube_api, FIRMWARE, policy)
        delete_nodes(kube_api, nodes)


def test_failed_flash_halts_and_hung_flash_times_out(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    namespace, tag = env
    halt_nodes = [f"ttf-{tag}-h{i}" for i in range(3)]
    hung_node = f"ttf-{tag}-t"
    add_fleet(dev_cluster, kube_api, halt_nodes, {"ttf-test": f"{tag}-h"})
    add_fleet(dev_cluster, kube_api, [hung_node], {"ttf-test": f"{tag}-t"})
    halting, hung = f"fwh-{tag}", f"fwt-{tag}"
    try:
        create_policy(
            kube_api,
            FIRMWARE,
            _policy(halting, f"{tag}-h", flasher={"podLabels": {"kmodkit.io/simulate": "fail"}}),
        )
        create_policy(
            kube_api,
            FIRMWARE,
            _policy(
                hung,
                f"{tag}-t",
                flasher={"podLabels": {"kmodkit.io/simulate": "hang"}},
                upgradePolicy={"flashTimeoutSeconds": 60},
            ),
        )

        failed = wait_until(
            lambda: [n for n, (s, _) in _states(kube_api, halting).items() if s == "Failed"],
            "a failed flash",
            timeout=60,
        )
        assert len(failed) == 1
        states = _states(kube_api, halting)
        assert states[failed[0]][1] == "FlashJobFailed"
        wait_until(
            lambda: (
                sorted(r for n, (_, r) in _states(kube_api, halting).items() if n != failed[0])
                == ["RolloutHalted", "RolloutHalted"]
            ),
            "the other nodes halted",
        )
        s = status(kube_api, FIRMWARE, halting)
        assert s["summary"]["failed"] == 1
        conds = {c["type"]: c["reason"] for c in s["conditions"]}
        assert conds == {"Ready": "NodesFailed", "Progressing": "Halted"}
        assert len(_jobs(kube_api, namespace, halting)) == 1

        entry = wait_until(
            lambda: next(
                (
                    n
                    for n in status(kube_api, FIRMWARE, hung).get("nodes", [])
                    if n["state"] == "Failed"
                ),
                None,
            ),
            "the hung flash to time out",
            timeout=120,
        )
        assert entry["reason"] == "FlashJobFailed"
        assert "flashTimeoutSeconds (60s)" in entry["message"]
    finally:
        delete_policy(kube_api, FIRMWARE, halting)
        delete_policy(kube_api, FIRMWARE, hung)
        delete_nodes(kube_api, [*halt_nodes, hung_node])


def test_the_guides_manifests_apply_unchanged(kube_api: Any, env: tuple[str, str]) -> None:
    seed = Path(__file__).with_name("tt_seed_manifests.yaml")
    import yaml

    ttdp, ttfwp = list(yaml.safe_load_all(seed.read_text()))
    try:
        create_policy(kube_api, DRIVER, ttdp)
        create_policy(kube_api, FIRMWARE, ttfwp)
        # The guides' `kubectl patch` commands.
        patch_policy(kube_api, DRIVER, "migration-test", {"spec": {"paused": False}})
        patch_policy(kube_api, FIRMWARE, "default", {"spec": {"version": "19.9.0"}})
        patch_policy(kube_api, FIRMWARE, "default", {"spec": {"flasher": {"forceWrite": True}}})
        s = wait_until(
            lambda: (
                status(kube_api, DRIVER, "migration-test").get("conditions")
                and status(kube_api, DRIVER, "migration-test")
            ),
            "the sample's status",
        )
        assert {c["type"]: c["reason"] for c in s["conditions"]}["Ready"] == "NoMatchingNodes"
        obj = client.CustomObjectsApi(kube_api).get_cluster_custom_object(*DRIVER, "migration-test")
        assert obj["spec"]["upgradePolicy"]["drain"]["fullNode"] is True
    finally:
        delete_policy(kube_api, DRIVER, "migration-test")
        delete_policy(kube_api, FIRMWARE, "default")


def _flash_pod(kube_api: Any, namespace: str, policy: str) -> Any:
    pods = (
        client.CoreV1Api(kube_api)
        .list_namespaced_pod(namespace, label_selector=f"firmware.tenstorrent.com/cr={policy}")
        .items
    )
    running = [p for p in pods if p.status.phase == "Running"]
    return running[0] if running else None


def _finish_flash(kube_api: Any, namespace: str, pod: Any) -> None:
    """The flasher exiting 0: kwok runs nothing, so the test writes what the kubelet would."""
    container = pod.spec.containers[0]
    client.CoreV1Api(kube_api).patch_namespaced_pod_status(
        pod.metadata.name,
        namespace,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": container.name,
                        "image": container.image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                    }
                ],
            }
        },
    )


def test_without_drain_a_node_is_flashed_uncordoned(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    """The seed's ``Pending → (Cordoning → Draining)? → Flashing``: drain.enable false means
    neither a cordon nor an eviction, and the device holder keeps running."""
    namespace, tag = env
    nodes = [f"ttf-{tag}-nd{i}" for i in range(2)]
    policy = f"fwnd-{tag}"
    add_fleet(dev_cluster, kube_api, nodes, {"ttf-test": f"{tag}-nd"})
    core = client.CoreV1Api(kube_api)
    holder = {
        "metadata": {"name": f"holder-{tag}", "labels": {"app": "fw-holder"}},
        "spec": {
            "nodeName": nodes[0],
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "dev", "hostPath": {"path": "/dev/tenstorrent"}}],
        },
    }
    core.create_namespaced_pod(namespace, holder)
    cordoned: set[str] = set()

    def tick() -> None:
        cordoned.update(
            n.metadata.name
            for n in core.list_node(label_selector=f"ttf-test={tag}-nd").items
            if n.spec.unschedulable
        )

    watcher = Poller(tick, 0.1)
    try:
        create_policy(
            kube_api,
            FIRMWARE,
            _policy(
                policy,
                f"{tag}-nd",
                upgradePolicy={"maxParallel": 2, "drain": {"enable": False, "force": True}},
            ),
        )
        wait_until(
            lambda: status(kube_api, FIRMWARE, policy).get("summary", {}).get("upToDate") == 2,
            "both nodes flashed",
            timeout=120,
        )
        watcher.stop()
        assert not watcher.errors
        assert cordoned == set(), f"cordoned although drain.enable is false: {sorted(cordoned)}"
        pod = core.read_namespaced_pod(f"holder-{tag}", namespace)
        assert pod.metadata.deletion_timestamp is None, "the device holder was evicted"
    finally:
        watcher.stop()
        delete_policy(kube_api, FIRMWARE, policy)
        core.delete_namespaced_pod(f"holder-{tag}", namespace, grace_period_seconds=0)
        delete_nodes(kube_api, nodes)


def test_deleting_the_policy_mid_flash_waits_for_the_flash(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    """Deleting a policy (even with foreground cascading, which deletes dependents first)
    while a node is being flashed kills neither the flash Job nor its pod, and the node
    stays cordoned until the flash has finished; then it is released and the policy goes."""
    namespace, tag = env
    node = f"ttf-{tag}-del"
    policy = f"fwdel-{tag}"
    add_fleet(dev_cluster, kube_api, [node], {"ttf-test": f"{tag}-del"})
    core = client.CoreV1Api(kube_api)
    objects = client.CustomObjectsApi(kube_api)
    try:
        create_policy(
            kube_api,
            FIRMWARE,
            _policy(policy, f"{tag}-del", flasher={"podLabels": {"kmodkit.io/simulate": "hang"}}),
        )
        pod = wait_until(lambda: _flash_pod(kube_api, namespace, policy), "the flash running")
        (job,) = _jobs(kube_api, namespace, policy)
        assert core.read_node(node).spec.unschedulable
        objects.delete_cluster_custom_object(*FIRMWARE, policy, propagation_policy="Foreground")

        def held() -> bool:
            obj = objects.get_cluster_custom_object(*FIRMWARE, policy)
            return bool(obj["metadata"].get("deletionTimestamp"))

        wait_until(held, "the deletion requested")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert core.read_node(node).spec.unschedulable, "released mid-flash"
            jobs = _jobs(kube_api, namespace, policy)
            assert [j.metadata.uid for j in jobs] == [job.metadata.uid], "the flash Job was deleted"
            assert jobs[0].metadata.deletion_timestamp is None, "the flash Job is being deleted"
            live = core.read_namespaced_pod(pod.metadata.name, namespace)
            assert live.metadata.deletion_timestamp is None, "the flash pod is being deleted"
            time.sleep(1)
        assert held(), "the policy went away mid-flash"
        conds = {c["type"]: c for c in status(kube_api, FIRMWARE, policy)["conditions"]}
        assert conds["Progressing"]["reason"] == "DeletionWaitsForFlash"
        assert node in conds["Progressing"]["message"]

        _finish_flash(kube_api, namespace, pod)
        wait_until(lambda: not core.read_node(node).spec.unschedulable, "released", timeout=60)

        def gone() -> bool:
            try:
                objects.get_cluster_custom_object(*FIRMWARE, policy)
            except client.ApiException as err:
                return err.status == 404
            return False

        wait_until(gone, "the policy deleted", timeout=60)
        keys = RolloutKeys.for_policy(names.firmware_policy_id(policy))
        assert keys.state not in core.read_node(node).metadata.labels
    finally:
        delete_policy(kube_api, FIRMWARE, policy)
        delete_nodes(kube_api, [node])


def test_a_policy_made_again_never_cuts_its_predecessors_flash(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    """An admin who strips the finalizer of a policy mid-flash and creates it again: the new
    policy (same name, same Job name) waits for the running flash, then flashes anew."""
    namespace, tag = env
    node = f"ttf-{tag}-again"
    policy = f"fwagain-{tag}"
    add_fleet(dev_cluster, kube_api, [node], {"ttf-test": f"{tag}-again"})
    objects = client.CustomObjectsApi(kube_api)
    body = _policy(policy, f"{tag}-again", flasher={"podLabels": {"kmodkit.io/simulate": "hang"}})
    try:
        create_policy(kube_api, FIRMWARE, body)
        pod = wait_until(lambda: _flash_pod(kube_api, namespace, policy), "the flash running")
        (old,) = _jobs(kube_api, namespace, policy)
        delete_policy(kube_api, FIRMWARE, policy)
        objects.patch_cluster_custom_object(
            *FIRMWARE,
            policy,
            {"metadata": {"finalizers": None}},
            _content_type="application/merge-patch+json",
        )

        def gone() -> bool:
            try:
                objects.get_cluster_custom_object(*FIRMWARE, policy)
            except client.ApiException as err:
                return err.status == 404
            return False

        wait_until(gone, "the policy gone")
        create_policy(kube_api, FIRMWARE, {**body, "spec": {**body["spec"], "flasher": {}}})
        uid = objects.get_cluster_custom_object(*FIRMWARE, policy)["metadata"]["uid"]
        wait_until(
            lambda: status(kube_api, FIRMWARE, policy).get("nodes"), "the new policy reconciled"
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            jobs = _jobs(kube_api, namespace, policy)
            assert [j.metadata.uid for j in jobs] == [old.metadata.uid], (
                "the earlier flash was deleted"
            )
            assert jobs[0].metadata.deletion_timestamp is None, "the earlier flash is being deleted"
            time.sleep(1)

        _finish_flash(kube_api, namespace, pod)
        new = wait_until(
            lambda: next(
                (
                    j
                    for j in _jobs(kube_api, namespace, policy)
                    if j.metadata.uid != old.metadata.uid
                ),
                None,
            ),
            "the new policy's own flash Job",
            timeout=60,
        )
        assert new.metadata.annotations["firmware.tenstorrent.com/cr-uid"] == uid
    finally:
        delete_policy(kube_api, FIRMWARE, policy)
        delete_nodes(kube_api, [node])


def test_two_policies_over_one_node_flash_it_once_and_the_younger_reports_node_conflict(
    dev_cluster: Any, kube_api: Any, env: tuple[str, str]
) -> None:
    """Two firmware policies cover one node: the older flashes it once, the younger reports
    NodeConflict and flashes nothing (no flash loop); deleting the older hands the node over."""
    namespace, tag = env
    node = f"ttf-{tag}-both"
    older, younger = f"fwa-{tag}", f"fwb-{tag}"
    add_fleet(dev_cluster, kube_api, [node], {"ttf-test": f"{tag}-both"})
    core = client.CoreV1Api(kube_api)
    try:
        create_policy(kube_api, FIRMWARE, _policy(older, f"{tag}-both"))
        time.sleep(1.1)  # creationTimestamp has a resolution of one second
        create_policy(kube_api, FIRMWARE, _policy(younger, f"{tag}-both", version="19.8.0"))
        wait_until(
            lambda: _states(kube_api, older).get(node) == ("Done", "FlashSucceeded"),
            "the older policy flashed the node",
            timeout=120,
        )
        wait_until(
            lambda: _states(kube_api, younger).get(node) == ("Conflict", "NodeConflict"),
            "the younger policy reports the conflict",
        )
        entry = next(n for n in status(kube_api, FIRMWARE, younger)["nodes"] if n["name"] == node)
        assert older in entry["message"]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert not _jobs(kube_api, namespace, younger), "the younger policy flashed the node"
            assert len(_jobs(kube_api, namespace, older)) == 1, "the node was flashed again"
            time.sleep(1)
        assert core.read_node(node).metadata.annotations[CURRENT] == "19.9.0.0"

        delete_policy(kube_api, FIRMWARE, older)
        wait_until(
            lambda: _states(kube_api, younger).get(node) == ("Done", "FlashSucceeded"),
            "the younger policy took the node over",
            timeout=120,
        )
        assert len(_jobs(kube_api, namespace, younger)) == 1
        assert core.read_node(node).metadata.annotations[CURRENT] == "19.8.0.0"
    finally:
        delete_policy(kube_api, FIRMWARE, older)
        delete_policy(kube_api, FIRMWARE, younger)
        delete_nodes(kube_api, [node])
