"""The real node's test images, made here and pushed to the node's registry with the
tests' own OCI client: Debian's busybox-static, the kernel tier's test modules (loose, and
as a driver image), its stand-in for tt-kmd, and a stand-in for Intel's GPU device plugin."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kmodkit_dev import build
from kmodkit_dev.registry import Registry
from tests.integration.oci_images import Client, Member, layer

BUSYBOX = "test/busybox"
KMOD = "test/kmod"
TT_KMD = "test/tt-kmd-stand-in"
# The test pair as a driver image a build would have pushed, tagged with the node's kernel.
DRIVER = "test/driver"
KUBECTL = "test/kubectl"
GPU_PLUGIN = "test/intel-gpu-plugin-stand-in"
TAG = "1"
# The Secret holding the node registry's login, in each test's namespace.
PULL_SECRET = "node-registry"
# The test module's firmware, as the kernel tier ships it (any content loads).
FIRMWARE = b"kmodkit test firmware\n"
# A stand-in for Intel's intel-gpu-plugin (which cannot be pulled here, and would find no
# Intel GPU in the VM). It checks what a device plugin starts with (the driver loaded, the
# kubelet's registration socket and the DRM class mounted, its node's name) and exits 1
# naming what is missing in its termination message, the only channel this node's pods
# have to the API; otherwise it waits for SIGTERM as a plugin would.
GPU_PLUGIN_SCRIPT = b"""#!/bin/sh
fail() { echo "stand-in intel-gpu-plugin: $*" > /dev/termination-log; exit 1; }
for m in kmodkit_test_dep kmodkit_test_dev; do
  grep -q "^$m " /proc/modules || fail "$m is not loaded"
done
[ -S /var/lib/kubelet/device-plugins/kubelet.sock ] || fail "no kubelet.sock"
[ -d /sys/class/drm ] || fail "no /sys/class/drm"
[ -n "${NODE_NAME:-}" ] || fail "NODE_NAME is not set"
[ "$#" = 0 ] || fail "unexpected arguments: $*"
sleep 2147483647 &
trap 'kill $!; exit 0' TERM
wait
"""


def busybox_layer() -> bytes:
    """/bin/busybox and a link per applet in /usr/bin, the images' PATH."""
    path = shutil.which("busybox")
    assert path, "Debian's busybox-static is missing"
    applets = subprocess.run([path, "--list"], capture_output=True, text=True, check=True)
    members = [
        Member("bin", None, 0o755),
        Member("bin/busybox", Path(path).read_bytes(), 0o755),
        Member("bin/sh", symlink="busybox"),
        Member("usr", None, 0o755),
        Member("usr/bin", None, 0o755),
        Member("tmp", None, 0o1777),
    ]
    members += [
        Member(f"usr/bin/{name}", symlink="/bin/busybox")
        for name in applets.stdout.split()
        if name != "busybox"
    ]
    return layer(members)


def module_layer(driver: Path, version: str) -> bytes:
    """The test pair under /modules and its firmware under /firmware."""
    extra = driver / "opt" / "lib" / "modules" / version / "extra"
    return layer(
        [
            Member("modules", None, 0o755),
            *(
                Member(f"modules/{ko.name}", ko.read_bytes())
                for ko in sorted(extra.glob("kmodkit_test_*.ko"))
            ),
            Member("firmware", None, 0o755),
            Member("firmware/kmodkit-test", None, 0o755),
            Member("firmware/kmodkit-test/fw.bin", FIRMWARE),
        ]
    )


def driver_layer(driver: Path, version: str) -> bytes:
    """The test pair where a module image keeps it (/opt/lib/modules/<kernel>/extra, the
    default dirName), and its firmware under /firmware."""
    extra = driver / "opt" / "lib" / "modules" / version / "extra"
    return layer(
        [
            *(
                Member(f"opt/lib/modules/{version}/extra/{ko.name}", ko.read_bytes())
                for ko in sorted(extra.glob("kmodkit_test_*.ko"))
            ),
            Member("firmware/kmodkit-test/fw.bin", FIRMWARE),
        ]
    )


def push_all(reg: Registry, kernel_cache: Path) -> dict[str, str]:
    """Push the images; their references by name."""
    base = busybox_layer()
    client = Client(reg)
    client.push_image(BUSYBOX, TAG, [base])
    client.push_image(KMOD, TAG, [base, module_layer(kernel_cache / "driver", kernel_cache.name)])
    version = kernel_cache.name
    client.push_image(DRIVER, version, [base, driver_layer(kernel_cache / "driver", version)])
    tt_kmd = (kernel_cache / "ttmod" / "tenstorrent.ko").read_bytes()
    client.push_image(TT_KMD, TAG, [base, layer([Member("modules/tenstorrent.ko", tt_kmd)])])
    # devcluster's own kubectl (static): an in-cluster API client for a pod.
    kubectl = layer([Member("kubectl", build.binary("kubectl").read_bytes(), 0o755)])
    client.push_image(KUBECTL, TAG, [base, kubectl])
    plugin = layer([Member("usr/bin/intel-gpu-plugin", GPU_PLUGIN_SCRIPT, 0o755)])
    client.push_image(GPU_PLUGIN, TAG, [base, plugin], entrypoint=["/usr/bin/intel-gpu-plugin"])
    refs = {
        name: f"{reg.host}/{name}:{TAG}" for name in (BUSYBOX, KMOD, TT_KMD, KUBECTL, GPU_PLUGIN)
    }
    return {**refs, DRIVER: f"{reg.host}/{DRIVER}:{version}"}
