"""``kmodkit tenstorrent migrate-node`` on the real node, against DKMS state planted in it.

The node gets what a DKMS install of tt-kmd leaves: the module under
/lib/modules/<kernel>/updates/dkms, indexed by depmod and loaded (the kernel tier's
stand-in for tt-kmd, tests/kernel/ttmod: a module named tenstorrent with
/dev/tenstorrent/0), DKMS's tree under /var/lib/dkms and its sources under /usr/src.
The command's vacate pod then runs on the node's kubelet, chrooted into the node, with
the node's own kmod: it refuses while a pod holds the device, naming the process; with
the holder gone it unloads the module, removes every trace and says so; run again it
finds nothing and changes nothing. dkms itself is not installed on the node: the
procedure removes DKMS's files without it, which is the path it takes on such a host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kmodkit.backends.tenstorrent.vacate import EXIT_HELD, VACATED
from kmodkit_dev import realnode
from kmodkit_dev.waiting import wait_until
from tests.realnode import images
from tests.realnode.test_node import core, pod, wait_phase

pytestmark = pytest.mark.timeout(1200)
HOST = {"name": "host", "hostPath": {"path": "/", "type": "Directory"}}
# A shell in the node's root, with the node's own tools.
ON_NODE = "chroot /host /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin"
PLANT = f"""set -eu
k=$(uname -r)
mkdir -p /host/lib/modules/$k/updates/dkms /host/var/lib/dkms/tenstorrent/2.0.0/$k/x86_64/module
cp /modules/tenstorrent.ko /host/lib/modules/$k/updates/dkms/
cp /modules/tenstorrent.ko /host/var/lib/dkms/tenstorrent/2.0.0/$k/x86_64/module/
mkdir -p /host/usr/src/tenstorrent-2.0.0
echo 'PACKAGE_NAME="tenstorrent"' > /host/usr/src/tenstorrent-2.0.0/dkms.conf
ln -s /usr/src/tenstorrent-2.0.0 /host/var/lib/dkms/tenstorrent/2.0.0/source
{ON_NODE} depmod -a $k
{ON_NODE} modprobe tenstorrent
{{ cat /sys/module/tenstorrent/version; ls /host/dev/tenstorrent; }} > /dev/termination-log
"""
# What is left of it, one line each (empty: nothing).
TRACES = f"""k=$(uname -r)
{{ ls -d /sys/module/tenstorrent /host/var/lib/dkms/tenstorrent /host/usr/src/tenstorrent-* \\
    /host/lib/modules/$k/updates/dkms/tenstorrent.ko 2>/dev/null
  {ON_NODE} modprobe -n tenstorrent 2>/dev/null && echo "modprobe finds tenstorrent"
}} > /dev/termination-log
true
"""


def node_pod(name: str, image: str, script: str, **extra: Any) -> dict[str, Any]:
    """A privileged pod on the real node with the node's root at /host."""
    return pod(
        name,
        image,
        script,
        container={
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
        },
        volumes=[HOST],
        **extra,
    )


def run_to_end(kube_api: Any, ns: str, manifest: dict[str, Any]) -> str:
    """Run a pod to its end; its termination message."""
    name = manifest["metadata"]["name"]
    core(kube_api).create_namespaced_pod(ns, manifest)
    done = wait_phase(kube_api, ns, name, "Succeeded", "Failed")
    state = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Succeeded", state.message
    core(kube_api).delete_namespaced_pod(name, ns)
    return str(state.message or "")


def migrate(kubeconfig: str, ns: str, image: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "kmodkit"),
            "tenstorrent",
            "migrate-node",
            realnode.NODE_NAME,
            "--namespace",
            ns,
            "--image",
            image,
            "--timeout",
            "600",
        ],
        env={**os.environ, "KUBECONFIG": kubeconfig},
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_migrate_node_refuses_while_held_then_vacates_dkms_and_is_safe_to_repeat(
    kube_api: Any,
    kubeconfig: str,
    ns: str,
    image_refs: dict[str, str],
    kernel: str,
) -> None:
    busybox = image_refs[images.BUSYBOX]
    # The vacate pod names no pull secret: as for any pod, the namespace's service
    # account supplies the registry's.
    core(kube_api).patch_namespaced_service_account(
        "default", ns, {"imagePullSecrets": [{"name": images.PULL_SECRET}]}
    )
    planted = run_to_end(kube_api, ns, node_pod("plant", image_refs[images.TT_KMD], PLANT))
    assert planted.split() == ["2.0.0", "0"], planted

    # 1. A pod holding the device: refused, the holder named, nothing changed.
    # As a workload holds it: the device at its own path, the node's given to the pod.
    holder = pod(
        "holder",
        busybox,
        "exec 3</dev/tenstorrent/0; echo held > /dev/termination-log; exec sleep 3600",
        restart="Always",
        terminationGracePeriodSeconds=1,
        container={
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "device", "mountPath": "/dev/tenstorrent"}],
        },
        volumes=[{"name": "device", "hostPath": {"path": "/dev/tenstorrent", "type": "Directory"}}],
    )
    core(kube_api).create_namespaced_pod(ns, holder)
    wait_phase(kube_api, ns, "holder", "Running")
    refused = migrate(kubeconfig, ns, busybox)
    assert refused.returncode == EXIT_HELD, refused.stdout + refused.stderr
    assert re.search(
        r"^found: pid \d+ \(sleep\) holds /dev/tenstorrent/0$", refused.stdout, re.M
    ), refused.stdout
    assert "refused: /dev/tenstorrent is in use" in refused.stdout
    assert "did:" not in refused.stdout
    assert "found: tenstorrent loaded, version 2.0.0, refcnt 1" in refused.stdout

    # 2. With the holder gone: unloaded, DKMS's tree, sources and module removed, verified.
    core(kube_api).delete_namespaced_pod("holder", ns)
    wait_until(
        lambda: (
            not core(kube_api).list_namespaced_pod(ns, field_selector="metadata.name=holder").items
        ),
        "the holder gone",
        timeout=120,
    )
    vacated = migrate(kubeconfig, ns, busybox)
    assert vacated.returncode == 0, vacated.stdout + vacated.stderr
    did = [line for line in vacated.stdout.splitlines() if line.startswith("did: ")]
    assert did == [
        "did: rmmod tenstorrent",
        "did: rm -rf /var/lib/dkms/tenstorrent",
        "did: rm -rf /usr/src/tenstorrent-2.0.0",
        f"did: rm /lib/modules/{kernel}/updates/dkms/tenstorrent.ko",
        f"did: depmod -a {kernel}",
    ], vacated.stdout
    assert VACATED in vacated.stdout
    assert run_to_end(kube_api, ns, node_pod("traces", busybox, TRACES)) == ""

    # 3. Again: nothing found, nothing done, the same verdict.
    again = migrate(kubeconfig, ns, busybox)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "did:" not in again.stdout and VACATED in again.stdout, again.stdout
    assert "found: tenstorrent not loaded" in again.stdout
