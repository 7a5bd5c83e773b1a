"""Shared pieces of the Tenstorrent integration tests: the operator, a fleet, a fake builder.

No test lives here. On kwok nothing runs inside the pods, so ``FakeBuilder``
plays the builder's node side: it labels each node as the real entrypoint does
(install mode, loaded tt-kmd version, tt-smi version), and on the nodes the
test says are held it reports the refused unload the way the real builder's
container status does.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.backends.tenstorrent import keys
from kmodkit_dev import cluster as devcluster
from kmodkit_dev import tenstorrent_demo as demo_objects
from kmodkit_dev.nodes import TENSTORRENT_LABELS, node_manifest
from kmodkit_dev.operator import Operator, running_operator
from tests.integration.crds_util import install

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
DRIVER = ("driver.tenstorrent.com", "v1alpha1", "tenstorrentdriverpolicies")
FIRMWARE = ("firmware.tenstorrent.com", "v1alpha1", "tenstorrentfirmwarepolicies")
BUILDER_SELECTOR = "app.kubernetes.io/name=tt-kmd-installer"
KERNEL = "6.8.0-45-generic"
FLASHER_ACCOUNT = demo_objects.FLASHER_ACCOUNT


def operator_env(namespace: str, builders_played: bool = False) -> dict[str, str]:
    """The settings of the operator ``tt_operator`` runs (to start another one like it).

    ``builders_played``: each builder pod runs, not Ready, on kwok until ``FakeBuilder``
    sets it Ready once it served the pod, as a real builder's readiness probe passes only
    once its driver is loaded (kwok's stages read the pod's KMODKIT_SIMULATE_READY).
    Without it kwok makes a builder Ready the moment it is bound.
    """
    env = {
        "KMODKIT_NAMESPACE": namespace,
        "KMODKIT_BACKENDS": "tenstorrent",
        "KMODKIT_TT_SERVICE_ACCOUNT": "default",
        "KMODKIT_TT_FLASHER_SERVICE_ACCOUNT": FLASHER_ACCOUNT,
        "KMODKIT_EXTRA_ENV_HTTPS_PROXY": "http://proxy.example:3128",
    }
    if builders_played:
        env["KMODKIT_EXTRA_ENV_KMODKIT_SIMULATE_READY"] = "probe"
    return env


@contextmanager
def tt_operator(
    kubeconfig: str, kube_api: Any, log_dir: Path, builders_played: bool = False
) -> Iterator[tuple[Operator, str]]:
    """The real operator, serving the Tenstorrent backend, with its own namespace
    (``builders_played`` as ``operator_env`` takes it)."""
    install(kube_api)
    core = client.CoreV1Api(kube_api)
    namespace = f"tt-op-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, demo_objects.flasher_account())
    try:
        with running_operator(
            kubeconfig, log_dir / "operator.log", **operator_env(namespace, builders_played)
        ) as op:
            yield op, namespace
    finally:
        core.delete_namespace(namespace, propagation_policy="Background")


def add_fleet(cluster: Any, kube_api: Any, names: list[str], extra: dict[str, str]) -> None:
    devcluster.add_nodes(
        cluster, [node_manifest(n, KERNEL, {**TENSTORRENT_LABELS, **extra}) for n in names]
    )


def delete_nodes(kube_api: Any, names: list[str]) -> None:
    core = client.CoreV1Api(kube_api)
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as err:
            if err.status != 404:
                raise


def create_policy(kube_api: Any, kind: tuple[str, str, str], body: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube_api).create_cluster_custom_object(*kind, body)


def patch_policy(
    kube_api: Any, kind: tuple[str, str, str], name: str, patch: dict[str, Any]
) -> None:
    client.CustomObjectsApi(kube_api).patch_cluster_custom_object(
        *kind, name, patch, _content_type=MERGE
    )


def delete_policy(kube_api: Any, kind: tuple[str, str, str], name: str) -> None:
    try:
        client.CustomObjectsApi(kube_api).delete_cluster_custom_object(*kind, name)
    except ApiException as err:
        if err.status != 404:
            raise


def status(kube_api: Any, kind: tuple[str, str, str], name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube_api).get_cluster_custom_object(*kind, name)
    return dict(obj.get("status") or {})


def node_labels(kube_api: Any, name: str) -> dict[str, str]:
    return dict(client.CoreV1Api(kube_api).read_node(name).metadata.labels or {})


def label_node(kube_api: Any, name: str, labels: dict[str, str | None]) -> None:
    client.CoreV1Api(kube_api).patch_node(
        name, {"metadata": {"labels": labels}}, _content_type=MERGE
    )


class Poller:
    """Calls ``tick`` every ``interval`` seconds on a thread until stopped."""

    def __init__(self, tick: Callable[[], None], interval: float = 0.2) -> None:
        self.errors: list[BaseException] = []
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.is_set():
                try:
                    tick()
                except Exception as err:  # a test thread must not die silently
                    self.errors.append(err)
                self._stop.wait(interval)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class FakeBuilder:
    """Plays the builder entrypoint on kwok nodes.

    ``dkms`` nodes have DKMS signals (labelled install-mode=host). A pod whose tt-kmd version is
    already loaded adopts it; on a node with nothing loaded it loads at once; on a node with
    another version loaded it reloads only while the rollout has the node in ``swapping`` or
    ``validating`` (read from the label its ``TT_ROLLOUT_STATE_LABEL`` names) and waits, NotReady,
    until then, as the real entrypoint does. On ``held`` nodes a process keeps /dev/tenstorrent
    open, so a reload without forceUnload is refused and the container crash-loops with the holder
    named in its termination message. On ``refusing`` nodes every pod without forceUnload
    crash-loops that way, whatever is loaded (an older builder that unloaded on its own).
    ``reloads`` records (node, rollout state) of every reload; ``adopted`` the pods that adopted.
    On ``building`` nodes the builder is still compiling: it reports nothing until the node
    leaves the set.
    """

    def __init__(self, kube_api: Any, namespace: str) -> None:
        self.dkms: set[str] = set()
        self.held: set[str] = set()
        self.refusing: set[str] = set()
        self.reloads: list[tuple[str, str]] = []
        self.adopted: list[str] = []
        self.building: set[str] = set()
        self._core = client.CoreV1Api(kube_api)
        self._namespace = namespace
        self._done: set[str] = set()
        self._waiting: set[str] = set()
        self.poller = Poller(self._tick)

    def _tick(self) -> None:
        for pod in self._core.list_namespaced_pod(
            self._namespace, label_selector=BUILDER_SELECTOR
        ).items:
            if pod.metadata.uid in self._done or pod.metadata.deletion_timestamp:
                continue
            if pod.status.phase != "Running" or not pod.spec.node_name:
                continue
            if self._serve(pod):
                self._done.add(pod.metadata.uid)

    def _serve(self, pod: Any) -> bool:
        """One look at a new pod; False while it waits for the rollout."""
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        node = pod.spec.node_name
        if node in self.building:
            return False
        forced = env.get("TT_FORCE_UNLOAD") == "true"
        if node in self.dkms:
            label_node(self._core.api_client, node, dict(demo_objects.builder_report("", True)))
            self._ready(pod)
            return True
        if node in self.refusing and not forced:
            self._crash_loop(pod)
            return True
        labels = self._core.read_node(node).metadata.labels or {}
        loaded = labels.get(keys.TT_KMD_VERSION_LABEL, "")
        wanted = env["TT_KMD_VERSION"]
        if loaded == wanted:
            self.adopted.append(node)
        elif loaded:
            state = labels.get(env.get("TT_ROLLOUT_STATE_LABEL") or "", "")
            if state not in ("swapping", "validating"):
                self._hold(pod)
                return False
            self.reloads.append((node, state))
            if node in self.held and not forced:
                self._crash_loop(pod)
                return True
        report: dict[str, str | None] = {
            **demo_objects.builder_report(wanted, False),
            keys.TT_STANDBY_POD_LABEL: None,
        }
        label_node(self._core.api_client, node, report)
        self._ready(pod)
        return True

    def _ready(self, pod: Any) -> None:
        """The pod passes its readiness probe now (kwok made it Ready already unless the
        operator's builders are played, or it waited NotReady for the rollout)."""
        conditions = pod.status.conditions or []
        if not any(c.type == "Ready" and c.status == "True" for c in conditions):
            self._set_ready(pod, True)

    def _hold(self, pod: Any) -> None:
        if pod.metadata.uid not in self._waiting:
            self._set_ready(pod, False)
            self._waiting.add(pod.metadata.uid)

    def _set_ready(self, pod: Any, ready: bool) -> None:
        value = "True" if ready else "False"
        self._core.patch_namespaced_pod_status(
            pod.metadata.name,
            self._namespace,
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": value},
                        {"type": "ContainersReady", "status": value},
                    ]
                }
            },
            _content_type=STRATEGIC,
        )

    def vacate(self, node: str) -> str:
        """DKMS vacated under the standby builder: it names itself on the node and waits
        to be replaced (what tt-builder does). Returns the standby pod's name."""
        self.dkms.discard(node)
        (pod,) = [
            p
            for p in self._core.list_namespaced_pod(
                self._namespace,
                label_selector=BUILDER_SELECTOR,
                field_selector=f"spec.nodeName={node}",
            ).items
            if not p.metadata.deletion_timestamp
        ]
        label_node(
            self._core.api_client,
            node,
            {keys.TT_STANDBY_POD_LABEL: pod.metadata.name, keys.TT_INSTALL_MODE_LABEL: None},
        )
        return str(pod.metadata.name)

    def _crash_loop(self, pod: Any) -> None:
        refusal = {
            "level": "error",
            "event": "unload.refused",
            "message": "tenstorrent is in use (refcnt 1); drain the node or set forceUnload",
            "holders": [{"pid": 4242, "comm": "tt-smi"}],
        }
        container = pod.spec.containers[0]
        self._core.patch_namespaced_pod_status(
            pod.metadata.name,
            self._namespace,
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "False"},
                        {"type": "ContainersReady", "status": "False"},
                    ],
                    "containerStatuses": [
                        {
                            "name": container.name,
                            "image": container.image,
                            "imageID": "",
                            "ready": False,
                            "restartCount": 3,
                            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                            "lastState": {
                                "terminated": {"exitCode": 3, "message": json.dumps(refusal)}
                            },
                        }
                    ],
                }
            },
            _content_type=STRATEGIC,
        )

    def stop(self) -> None:
        self.poller.stop()
