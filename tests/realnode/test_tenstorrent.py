"""A TenstorrentDriverPolicy on the real node, end to end, with the product's builder image.

The operator (``kmodkit run``, Tenstorrent backend) runs the builder DaemonSet; its pod
runs the image's real entrypoint (``tt-builder``) and agent on the node's kernel. tt-kmd
is the kernel tier's stand-in (tests/kernel/ttmod: a module named tenstorrent with
/dev/tenstorrent/0), served as a git repository with one tag per version
(``ttkmd-<version>``, MODULE_VERSION set to it) by the node's git daemon
(``realnode.SOURCES_URL``), the operator's ``KMODKIT_TT_KMD_REPOSITORY``: what an
air-gapped cluster's mirror is. tt-smi and the udev rule are the image's stand-ins
(kmodkit_dev/stand_ins): the test checks they are installed on the node, not what they do.

In order: DKMS sources planted on the node put the builder in host mode; once they are
removed, the rollout takes the node over and the new builder clones, builds, caches,
loads and labels; a version bump is rolled onto the node (cordoned, then uncordoned); then
the way back down, with the repository gone so that only the node's build cache can have
it, and with drain off and a process holding the device, which makes the new builder
crash-loop, named in the policy's status, until forceUnload has it killed. Last, a
TenstorrentFirmwarePolicy: the flasher image's real tt-flash-node downloads a bundle from
the node's file server (``realnode.FILES_URL``) and flashes it with the stand-in tt-flash,
which writes the version to the stand-in device's ``tt_fw_bundle_ver``; tt-smi's stand-in
reads it back from there (kmodkit_dev/tenstorrent_mirror.py, stand_ins/). Every label and
status is written by the product's pods and the operator; the test only reads them and the
node's files.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import images as product_images
from kmodkit_dev import realnode, tenstorrent_mirror
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.integration.test_tt_support import (
    BUILDER_SELECTOR,
    DRIVER,
    FIRMWARE,
    create_policy,
    delete_policy,
    patch_policy,
    status,
)
from tests.realnode import images
from tests.realnode.test_migrate import node_pod, run_to_end
from tests.realnode.test_module import STEP_TIMEOUT, node_labels
from tests.realnode.test_node import core, pod, read

pytestmark = pytest.mark.timeout(3000)
POLICY = "tt-real"
ACCOUNT = "tt-builder"
FLASHER_ACCOUNT = "tt-flasher"
FIRMWARE_POLICY = "tt-real-fw"
FW_VERSION = "80.18.0"
FW_BUNDLE = f"fw_pack-{FW_VERSION}.fwbundle"
# The stand-in device's attribute (tests/kernel/ttmod): the firmware its "chip" runs.
FW_ATTRIBUTE = "/sys/class/misc/tenstorrent0/tt_fw_bundle_ver"
FW_LABEL = "firmware.tenstorrent.com/fw-version"
FLASH_SELECTOR = "app.kubernetes.io/name=tt-flasher"
REPOSITORY = "tt-kmd.git"
VERSIONS = ("2.0.0", "2.1.0")
MODE = "driver.tenstorrent.com/install-mode"
KMD = "driver.tenstorrent.com/kmd-version"
SMI = "tt-smi.driver.tenstorrent.com/version"
DKMS_SOURCES = "/host/usr/src/tenstorrent-2.0.0"
# What the builder left on the node, one line each; then the loaded version.
NODE_FILES = """k=$(uname -r)
{ for v in 2.0.0 2.1.0; do
    [ -f /host/var/cache/tt-kmd/$k/$v/tenstorrent.ko ] && echo "cache $v"
  done
  [ -x /host/usr/local/bin/tt-smi ] && echo tt-smi
  [ -f /host/etc/udev/rules.d/50-tenstorrent.rules ] && echo udev-rule
  echo "loaded $(cat /sys/module/tenstorrent/version 2>/dev/null)"
} > /dev/termination-log
"""
# The node as it was: no tt-kmd loaded, nothing of the builder's left.
CLEAN = """rmmod tenstorrent 2>/dev/null || true
rm -rf /host/var/cache/tt-kmd /host/usr/local/bin/tt-smi /host/usr/src/tenstorrent-2.0.0 \\
  /host/etc/udev/rules.d/50-tenstorrent.rules
"""


@pytest.fixture
def kmd_repository(real_node: realnode.RealNode) -> Iterator[Path]:
    """tt-kmd's stand-in as a bare repository the node's git daemon serves."""
    bare = tenstorrent_mirror.kmd_repository(real_node.sources / REPOSITORY, VERSIONS)
    yield bare
    shutil.rmtree(bare, ignore_errors=True)


@pytest.fixture
def builder_account(kube_api: Any, ns: str) -> Iterator[str]:
    """The builder pods' account as the chart makes it: the pull secret, and the right to
    patch nodes (the builder labels its own); and the flash pods', the pull secret only."""
    for account in (ACCOUNT, FLASHER_ACCOUNT):
        core(kube_api).create_namespaced_service_account(
            ns,
            {"metadata": {"name": account}, "imagePullSecrets": [{"name": images.PULL_SECRET}]},
        )
    rbac = client.RbacAuthorizationV1Api(kube_api)
    role = f"{ns}-tt-builder"
    rbac.create_cluster_role(
        {
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": ns}],
        }
    )
    yield ACCOUNT
    rbac.delete_cluster_role_binding(role)
    rbac.delete_cluster_role(role)


@pytest.fixture
def operator(
    kubeconfig: str,
    kube_api: Any,
    ns: str,
    builder_account: str,
    kmd_repository: Path,
    destination: product_images.Destination,
    tmp_path: Path,
) -> Iterator[Operator]:
    install(kube_api)
    built = product_images.build_images(["tenstorrent-builder", "tenstorrent-flasher"], destination)
    with running_operator(
        kubeconfig,
        tmp_path / "operator.log",
        KMODKIT_NAMESPACE=ns,
        KMODKIT_BACKENDS="tenstorrent",
        KMODKIT_TT_BUILDER_IMAGE=built["tenstorrent-builder"],
        KMODKIT_TT_SERVICE_ACCOUNT=builder_account,
        KMODKIT_TT_FLASHER_IMAGE=built["tenstorrent-flasher"],
        KMODKIT_TT_FLASHER_SERVICE_ACCOUNT=FLASHER_ACCOUNT,
        KMODKIT_TT_REQUIRE_PCI_LABEL="false",
        KMODKIT_TT_KMD_REPOSITORY=realnode.SOURCES_URL + kmd_repository.name,
    ) as op:
        yield op


@pytest.fixture
def clean_node(kube_api: Any, ns: str, image_refs: dict[str, str]) -> Iterator[None]:
    """Leaves the node as the test found it, the policy deleted while the operator runs."""
    yield
    delete_policy(kube_api, FIRMWARE, FIRMWARE_POLICY)
    delete_policy(kube_api, DRIVER, POLICY)
    wait_until(lambda: not builders(kube_api, ns), "the builder pods gone", timeout=STEP_TIMEOUT)
    core(kube_api).patch_node(realnode.NODE_NAME, {"spec": {"unschedulable": None}})
    on_node(kube_api, ns, image_refs, "clean", CLEAN)


@pytest.fixture
def firmware_bundle(real_node: realnode.RealNode) -> Iterator[str]:
    """A bundle of FW_VERSION served to the node's pods; its URL."""
    path = real_node.files / FW_BUNDLE
    path.write_bytes(tenstorrent_mirror.firmware_bundle(f"{FW_VERSION}.0"))
    yield realnode.FILES_URL + FW_BUNDLE
    path.unlink()


def on_node(kube_api: Any, ns: str, image_refs: dict[str, str], name: str, script: str) -> str:
    return run_to_end(kube_api, ns, node_pod(name, image_refs[images.BUSYBOX], script))


def builders(kube_api: Any, ns: str) -> list[Any]:
    return list(core(kube_api).list_namespaced_pod(ns, label_selector=BUILDER_SELECTOR).items)


def policy(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "version": version,
            "nodeAffinity": {"matchLabels": {realnode.NODE_LABEL: "true"}},
        },
    }


def patch_spec(kube_api: Any, spec: dict[str, Any]) -> None:
    patch_policy(kube_api, DRIVER, POLICY, {"spec": spec})


class Rollout:
    """Waits for the policy to have the node at a version, watching it on the way: the
    node cordoned at some point (``cordoned``) and never left cordoned at the end."""

    def __init__(self, kube_api: Any) -> None:
        self.kube_api = kube_api
        self.cordoned = False

    def node_entry(self) -> dict[str, Any]:
        nodes = status(self.kube_api, DRIVER, POLICY).get("nodes") or []
        return next((n for n in nodes if n["name"] == realnode.NODE_NAME), {})

    def done_at(self, version: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def done() -> bool:
            node = core(self.kube_api).read_node(realnode.NODE_NAME)
            self.cordoned = self.cordoned or bool(node.spec.unschedulable)
            entry = self.node_entry()
            labels = node.metadata.labels or {}
            seen.update(entry=entry, labels={k: v for k, v in labels.items() if "tenstorrent" in k})
            at = labels.get(KMD) == version and labels.get(MODE) == "container"
            return at and entry.get("state") == "Done"

        try:
            wait_until(done, f"the node Done at tt-kmd {version}", timeout=STEP_TIMEOUT * 2)
        except AssertionError as err:
            raise AssertionError(f"{err}\nstatus and labels: {seen}") from err
        entry: dict[str, Any] = seen["entry"]
        assert not core(self.kube_api).read_node(realnode.NODE_NAME).spec.unschedulable
        return entry


def test_a_driver_policy_builds_caches_rolls_and_unblocks_on_the_real_node(
    kube_api: Any,
    ns: str,
    real_node: realnode.RealNode,
    image_refs: dict[str, str],
    kmd_repository: Path,
    firmware_bundle: str,
    operator: Operator,
    clean_node: None,
) -> None:
    # 1. DKMS's sources on the node: the builder stands by in host mode.
    plant = f"mkdir -p {DKMS_SOURCES} && echo PACKAGE_NAME=tenstorrent > {DKMS_SOURCES}/dkms.conf"
    on_node(kube_api, ns, image_refs, "plant", plant)
    create_policy(kube_api, DRIVER, policy(VERSIONS[0]))
    wait_until(
        lambda: (
            node_labels(kube_api, real_node.name).get(MODE) == "host"
            and status(kube_api, DRIVER, POLICY).get("summary", {}).get("hostManaged") == 1
        ),
        "the node host-managed",
        timeout=STEP_TIMEOUT,
        interval=2,
    )
    assert KMD not in node_labels(kube_api, real_node.name)  # nothing loaded

    # 2. DKMS vacated: the rollout replaces the standby builder, and the new one clones
    # ttkmd-2.0.0 from the mirror, builds it against the node's headers, caches and loads
    # it, installs tt-smi and the udev rule, and labels the node.
    on_node(kube_api, ns, image_refs, "vacate", f"rm -rf {DKMS_SOURCES}")
    rollout = Rollout(kube_api)
    rollout.done_at(VERSIONS[0])
    assert rollout.cordoned, "the takeover went through the rollout's cordon"
    assert node_labels(kube_api, real_node.name)[SMI] == "0.0.0-standin"
    assert on_node(kube_api, ns, image_refs, "files", NODE_FILES).strip().split("\n") == [
        "cache 2.0.0", "tt-smi", "udev-rule", "loaded 2.0.0",
    ]  # fmt: skip

    # 3. A version bump, one node at a time: cordoned, reloaded, uncordoned.
    patch_spec(kube_api, {"version": VERSIONS[1]})
    rollout = Rollout(kube_api)
    rollout.done_at(VERSIONS[1])
    assert rollout.cordoned
    assert on_node(kube_api, ns, image_refs, "files", NODE_FILES).strip().split("\n") == [
        "cache 2.0.0", "cache 2.1.0", "tt-smi", "udev-rule", "loaded 2.1.0",
    ]  # fmt: skip

    # 4. Back down, with the repository gone (only the node's cache can have 2.0.0), drain
    # off and a process holding the device: the new builder refuses to unload, crash-loops
    # and is named with the holder in the status, until forceUnload has the holder killed.
    holder = pod(
        "holder",
        image_refs[images.BUSYBOX],
        "exec 3</dev/tenstorrent/0; exec sleep 100000",
        container={
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "dev", "mountPath": "/dev/tenstorrent"}],
        },
        volumes=[{"name": "dev", "hostPath": {"path": "/dev/tenstorrent"}}],
    )
    core(kube_api).create_namespaced_pod(ns, holder)
    wait_until(lambda: read(kube_api, ns, "holder").status.phase == "Running", "the holder runs")
    shutil.rmtree(kmd_repository)
    patch_spec(kube_api, {"version": VERSIONS[0], "upgradePolicy": {"drain": {"enable": False}}})
    entry = wait_until(
        lambda: (e := Rollout(kube_api).node_entry()).get("reason") == "BuilderCrashLoop" and e,
        "the builder crash-looping on the held device",
        timeout=STEP_TIMEOUT * 2,
        interval=2,
    )
    assert entry["state"] == "Failed", entry
    assert "(sleep)" in entry["message"] and "pid " in entry["message"], entry
    assert read(kube_api, ns, "holder").status.phase == "Running"
    assert node_labels(kube_api, real_node.name)[KMD] == VERSIONS[1]  # nothing unloaded

    patch_spec(kube_api, {"upgradePolicy": {"forceUnload": True}})
    Rollout(kube_api).done_at(VERSIONS[0])
    killed = wait_until(
        lambda: (p := read(kube_api, ns, "holder")).status.phase == "Failed" and p,
        "the holder killed",
    )
    assert killed.status.container_statuses[0].state.terminated.exit_code == 137
    assert on_node(kube_api, ns, image_refs, "files", NODE_FILES).strip().endswith("loaded 2.0.0")

    # 5. Firmware, with tt-kmd 2.0.0 loaded: the flash Job downloads the bundle from the
    # node's file server, flashes it with (the stand-in) tt-flash, resets and reads the
    # device back with tt-smi; the operator records what the node runs.
    read_fw = f"cat {FW_ATTRIBUTE} > /dev/termination-log"
    assert on_node(kube_api, ns, image_refs, "fw-before", read_fw).strip() == "80.10.0.0"
    create_policy(
        kube_api,
        FIRMWARE,
        {
            "apiVersion": "firmware.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentFirmwarePolicy",
            "metadata": {"name": FIRMWARE_POLICY},
            "spec": {
                "version": FW_VERSION,
                "bundleURL": firmware_bundle,
                "nodeAffinity": {"matchLabels": {realnode.NODE_LABEL: "true"}},
            },
        },
    )

    def flashed() -> dict[str, Any] | None:
        nodes = status(kube_api, FIRMWARE, FIRMWARE_POLICY).get("nodes") or []
        entry = next((n for n in nodes if n["name"] == real_node.name), {})
        assert entry.get("state") != "Failed", entry
        return entry if entry.get("state") == "Done" else None

    done = wait_until(flashed, "the node flashed", timeout=STEP_TIMEOUT * 2, interval=2)
    assert done["reason"] == "FlashSucceeded", done
    # What the chips report once flashed: the version the label and the device carry.
    readback = f"{FW_VERSION}.0"
    assert node_labels(kube_api, real_node.name)[FW_LABEL] == readback
    assert on_node(kube_api, ns, image_refs, "fw-after", read_fw).strip() == readback
    (flash_pod,) = core(kube_api).list_namespaced_pod(ns, label_selector=FLASH_SELECTOR).items
    assert flash_pod.spec.node_name == real_node.name
    assert flash_pod.status.phase == "Succeeded"
    assert f"GET /{FW_BUNDLE} " in real_node.logs["files"].read_text()
    assert not core(kube_api).read_node(real_node.name).spec.unschedulable
