"""Pods on devcluster's real node: a kubelet v1.36 and containerd in a qemu VM booting
Debian's kernel (kmodkit_dev.realnode). Every check is read from the API, as the
operator would see it; the images come from the node's registry (tests/realnode/images.py).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import realnode
from kmodkit_dev.waiting import wait_until
from tests.realnode import images

# Bounds for a VM under software emulation on 2 shared cores.
pytestmark = pytest.mark.timeout(900)
POD_TIMEOUT = 180.0
SECRET = images.PULL_SECRET


def core(kube_api: Any) -> Any:
    return client.CoreV1Api(kube_api)


def pod(
    name: str,
    image: str,
    script: str,
    *,
    restart: str = "Never",
    pull_secret: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "command": ["/bin/sh", "-c", script],
    }
    container.update(extra.pop("container", {}))
    spec: dict[str, Any] = {
        "nodeSelector": {realnode.NODE_LABEL: "true"},
        "restartPolicy": restart,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "containers": [container],
        **extra,
    }
    if pull_secret:
        spec["imagePullSecrets"] = [{"name": SECRET}]
    return {"metadata": {"name": name}, "spec": spec}


def read(kube_api: Any, ns: str, name: str) -> Any:
    return core(kube_api).read_namespaced_pod(name, ns)


def wait_phase(kube_api: Any, ns: str, name: str, *phases: str) -> Any:
    return wait_until(
        lambda: (p := read(kube_api, ns, name)).status.phase in phases and p,
        f"pod {name} in {phases}",
        timeout=POD_TIMEOUT,
        interval=1,
    )


def terminated(status: Any) -> Any:
    return status.state.terminated or (status.last_state and status.last_state.terminated)


def test_node_is_real_and_kwok_leaves_it_alone(kube_api: Any, real_node: realnode.RealNode) -> None:
    node = core(kube_api).read_node(real_node.name)
    info = node.status.node_info
    assert info.kubelet_version == "v1.36.3"
    assert info.container_runtime_version.startswith("containerd://1.6.")
    assert info.kernel_version.endswith("-amd64"), info.kernel_version
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    kwok = core(kube_api).list_node(label_selector="type=kwok").items
    assert len(kwok) == 2 and real_node.name not in {n.metadata.name for n in kwok}
    print(f"real node Ready {real_node.boot_seconds}s after qemu started")


def test_image_pull_needs_the_pull_secret(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    api = core(kube_api)
    started = time.monotonic()
    api.create_namespaced_pod(
        ns, pod("pulled", image_refs[images.BUSYBOX], "echo pulled > /dev/termination-log")
    )
    done = wait_phase(kube_api, ns, "pulled", "Succeeded", "Failed")
    seconds = time.monotonic() - started
    (status,) = done.status.container_statuses
    assert done.status.phase == "Succeeded"
    assert status.container_id.startswith("containerd://"), status.container_id
    assert status.image_id.startswith(f"{image_refs[images.BUSYBOX].rsplit(':', 1)[0]}@sha256:")
    assert status.state.terminated.message == "pulled\n"
    print(f"image pull and run to completion: {seconds:.1f}s")

    # The same image from another repository name is not cached: without the secret,
    # the registry refuses the kubelet.
    other = image_refs[images.KMOD]
    api.create_namespaced_pod(ns, pod("no-secret", other, "true", pull_secret=False))

    def refused() -> str:
        statuses = read(kube_api, ns, "no-secret").status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return (
            waiting.reason
            if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff")
            else ""
        )

    wait_until(refused, "the pull without secret to be refused", timeout=POD_TIMEOUT, interval=1)
    events = api.list_namespaced_event(ns, field_selector="involvedObject.name=no-secret").items
    assert any(
        "401" in (e.message or "") or "authoriz" in (e.message or "").lower() for e in events
    ), [e.message for e in events]


def test_init_container_runs_before_main(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    image = image_refs[images.BUSYBOX]
    manifest = pod(
        "init",
        image,
        "cat /work/from-init > /dev/termination-log",
        initContainers=[
            {
                "name": "first",
                "image": image,
                "command": ["/bin/sh", "-c", "echo init-ran > /work/from-init"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            }
        ],
        volumes=[{"name": "work", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "work", "mountPath": "/work"}]},
    )
    core(kube_api).create_namespaced_pod(ns, manifest)
    done = wait_phase(kube_api, ns, "init", "Succeeded", "Failed")
    (init,) = done.status.init_container_statuses
    (main,) = done.status.container_statuses
    assert init.state.terminated.exit_code == 0
    assert main.state.terminated.message == "init-ran\n"
    assert init.state.terminated.finished_at <= main.state.terminated.started_at


def test_host_path_sees_a_node_file(
    kube_api: Any, ns: str, image_refs: dict[str, str], real_node: realnode.RealNode
) -> None:
    token = secrets.token_hex(8)
    where = real_node.share / ns
    where.mkdir()
    (where / "hello").write_text(token)
    manifest = pod(
        "hostpath",
        image_refs[images.BUSYBOX],
        "cat /node/hello > /dev/termination-log",
        volumes=[{"name": "node", "hostPath": {"path": str(where), "type": "Directory"}}],
        container={"volumeMounts": [{"name": "node", "mountPath": "/node", "readOnly": True}]},
    )
    core(kube_api).create_namespaced_pod(ns, manifest)
    done = wait_phase(kube_api, ns, "hostpath", "Succeeded", "Failed")
    assert done.status.container_statuses[0].state.terminated.message == token


def test_privileged_container_loads_a_module_into_the_node_kernel(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    # The kernel reads firmware from its own root: the VM's initramfs, which the
    # node sees at FIRMWARE_ROOT.
    script = (
        "set -e; cp -r /firmware/kmodkit-test /node-firmware/; "
        "insmod /modules/kmodkit_test_dep.ko; insmod /modules/kmodkit_test_dev.ko; "
        "{ grep '^kmodkit_test' /proc/modules | cut -d' ' -f1 | sort; "
        "echo size=$(cat /sys/module/kmodkit_test_dev/parameters/firmware_size); "
        "rmmod kmodkit_test_dev kmodkit_test_dep; "
        "echo after=$(grep -c '^kmodkit_test' /proc/modules || true); } > /dev/termination-log"
    )
    manifest = pod(
        "insmod",
        image_refs[images.KMOD],
        script,
        volumes=[
            {
                "name": "fw",
                "hostPath": {"path": realnode.FIRMWARE_ROOT, "type": "DirectoryOrCreate"},
            }
        ],
        container={
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "fw", "mountPath": "/node-firmware"}],
        },
    )
    core(kube_api).create_namespaced_pod(ns, manifest)
    done = wait_phase(kube_api, ns, "insmod", "Succeeded", "Failed")
    message = done.status.container_statuses[0].state.terminated.message
    assert done.status.phase == "Succeeded", message
    assert message.split("\n") == [
        "kmodkit_test_dep",
        "kmodkit_test_dev",
        f"size={len(images.FIRMWARE)}",
        "after=0",
        "",
    ]


def test_exec_readiness_probe_gates_ready(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    # The container makes the probe's file itself, 20 s after it starts.
    delay = 20
    manifest = pod(
        "probed",
        image_refs[images.BUSYBOX],
        f"sleep {delay}; touch /tmp/ready; exec sleep 3600",
        restart="Always",
        terminationGracePeriodSeconds=1,
        container={
            "readinessProbe": {
                "exec": {"command": ["/bin/sh", "-c", "test -f /tmp/ready"]},
                "periodSeconds": 2,
                "timeoutSeconds": 10,
            },
        },
    )
    core(kube_api).create_namespaced_pod(ns, manifest)

    def ready() -> Any:
        conditions = read(kube_api, ns, "probed").status.conditions or []
        return next((c for c in conditions if c.type == "Ready"), None)

    running = wait_phase(kube_api, ns, "probed", "Running")
    started = running.status.container_statuses[0].state.running.started_at
    condition: Any = wait_until(
        lambda: (c := ready()) is not None and c.status == "True" and c,
        "the probe to pass",
        timeout=POD_TIMEOUT,
        interval=1,
    )
    # Not Ready while the file was missing: Ready only once it was made.
    assert (condition.last_transition_time - started).total_seconds() >= delay


def test_termination_message_is_read_from_status(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    core(kube_api).create_namespaced_pod(
        ns,
        pod(
            "failing",
            image_refs[images.BUSYBOX],
            "echo 'driver refused: -22' > /dev/termination-log; exit 7",
        ),
    )
    done = wait_phase(kube_api, ns, "failing", "Succeeded", "Failed")
    state = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Failed"
    assert (state.exit_code, state.message, state.reason) == (7, "driver refused: -22\n", "Error")


def test_sigterm_reaches_the_container_on_delete(
    kube_api: Any, ns: str, image_refs: dict[str, str], real_node: realnode.RealNode
) -> None:
    where = real_node.share / ns
    where.mkdir()
    script = (
        "trap 'echo got-TERM > /node/term; exit 0' TERM; "
        "echo started > /node/started; while true; do sleep 1; done"
    )
    manifest = pod(
        "term",
        image_refs[images.BUSYBOX],
        script,
        volumes=[{"name": "node", "hostPath": {"path": str(where), "type": "Directory"}}],
        container={"volumeMounts": [{"name": "node", "mountPath": "/node"}]},
    )
    api = core(kube_api)
    api.create_namespaced_pod(ns, manifest)
    wait_until(
        lambda: (where / "started").exists(),
        "the container to start",
        timeout=POD_TIMEOUT,
        interval=1,
    )
    deleted = time.monotonic()
    api.delete_namespaced_pod("term", ns)
    wait_until(
        lambda: (where / "term").exists(), "the container's TERM trap", timeout=60, interval=0.5
    )
    assert (where / "term").read_text() == "got-TERM\n"
    # Well inside the 30 s grace period: the signal, not the SIGKILL after it.
    assert time.monotonic() - deleted < 25


def test_crashing_container_is_restarted(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    core(kube_api).create_namespaced_pod(
        ns,
        pod(
            "crashing",
            image_refs[images.BUSYBOX],
            "echo crashed > /dev/termination-log; exit 3",
            restart="Always",
        ),
    )

    def restarted() -> Any:
        statuses = read(kube_api, ns, "crashing").status.container_statuses or []
        return statuses and statuses[0].restart_count > 0 and statuses[0]

    status = wait_until(restarted, "a restart", timeout=POD_TIMEOUT, interval=1)
    last = terminated(status)
    assert (last.exit_code, last.message) == (3, "crashed\n")


def test_pod_reaches_the_api_as_an_in_cluster_client(
    kube_api: Any, ns: str, image_refs: dict[str, str]
) -> None:
    # kubectl with no kubeconfig uses the in-cluster config: the kubernetes Service's
    # address from the environment, the service account's token and CA, TLS verified.
    manifest = pod(
        "in-cluster",
        image_refs[images.KUBECTL],
        "/kubectl auth whoami -o jsonpath='{.status.userInfo.username}' "
        "> /dev/termination-log 2>&1",
        automountServiceAccountToken=True,
        container={"env": [{"name": "HOME", "value": "/tmp"}]},
    )
    core(kube_api).create_namespaced_pod(ns, manifest)
    done = wait_phase(kube_api, ns, "in-cluster", "Succeeded", "Failed")
    message = done.status.container_statuses[0].state.terminated.message
    assert done.status.phase == "Succeeded", message
    assert message == f"system:serviceaccount:{ns}:default"
