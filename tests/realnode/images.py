"""The real node's test images, made here and pushed to the node's registry with the
tests' own OCI client: Debian's busybox-static, and the kernel tier's test modules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kmodkit_dev import build
from kmodkit_dev.registry import Registry
from tests.integration.oci_images import Client, Member, layer

BUSYBOX = "test/busybox"
KMOD = "test/kmod"
KUBECTL = "test/kubectl"
TAG = "1"
# The Secret holding the node registry's login, in each test's namespace.
PULL_SECRET = "node-registry"
# The test module's firmware, as the kernel tier ships it (any content loads).
FIRMWARE = b"kmodkit test firmware\n"


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


def push_all(reg: Registry, kernel_cache: Path) -> dict[str, str]:
    """Push the images; their references by name."""
    base = busybox_layer()
    client = Client(reg)
    client.push_image(BUSYBOX, TAG, [base])
    client.push_image(KMOD, TAG, [base, module_layer(kernel_cache / "driver", kernel_cache.name)])
    # devcluster's own kubectl (static): an in-cluster API client for a pod.
    kubectl = layer([Member("kubectl", build.binary("kubectl").read_bytes(), 0o755)])
    client.push_image(KUBECTL, TAG, [base, kubectl])
    return {name: f"{reg.host}/{name}:{TAG}" for name in (BUSYBOX, KMOD, KUBECTL)}
