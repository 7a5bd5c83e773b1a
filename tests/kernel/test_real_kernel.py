"""The node agent against a real Linux kernel, booted under qemu (software emulation).

``prepare.sh`` fetches Debian's current kernel, its headers, qemu and busybox,
builds our test module pair and an initramfs (cached per kernel version). The VM
mounts this machine's root read-only over virtio-9p and runs
``vm_scenario.py`` with this interpreter, so the agent under test is this
checkout. One boot serves every test here; each test asserts one check the
scenario reported on the console.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MARKER = "KMODKIT-CHECK "
CHECKS = [
    "pair_loads_only_in_order",
    "detect_container",
    "status_before_load",
    "load",
    "firmware_placed_before_load",
    "load_again_does_nothing",
    "status_ready",
    "unload_refused_naming_the_holder",
    "force_unload_kills_the_holder",
    "dkms_state_signal",
    "dkms_source_signal",
]

# Bounds, not expectations: on 2 cores without KVM a cold prepare takes 2-4
# minutes (apt, a 70 MB kernel package) and the VM run about 2 (4 with both cores busy).
PREPARE_TIMEOUT_SECONDS = 540
QEMU_TIMEOUT_SECONDS = 480


@pytest.fixture(scope="session")
def kernel_cache() -> Path:
    done = subprocess.run(
        ["sh", str(HERE / "prepare.sh")],
        capture_output=True,
        text=True,
        timeout=PREPARE_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"tests/kernel/prepare.sh failed:\n{done.stderr[-4000:]}", pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vm_checks(kernel_cache: Path) -> dict[str, Any]:
    python = Path(sys.executable)
    for needed in (REPO, python, kernel_cache):
        # The VM covers /run with a tmpfs for its scratch space.
        assert not str(needed.absolute()).startswith("/run/"), f"{needed} is hidden in the VM"
    version = kernel_cache.name
    # Software emulation on purpose: it is what CI machines have (and nested
    # KVM can hang), and this tier's time budget is set for it.
    command = [
        "qemu-system-x86_64",
        "-machine", "accel=tcg",
        "-cpu", "max",
        "-m", "768",
        "-smp", "1",
        "-nographic",
        "-vga", "none",
        "-nic", "none",
        "-no-reboot",
        "-kernel", str(kernel_cache / "image" / "boot" / f"vmlinuz-{version}"),
        "-initrd", str(kernel_cache / "initramfs.cpio.gz"),
        "-append",
        " ".join(
            [
                "console=ttyS0 panic=-1 quiet loglevel=1",
                f"KMODKIT_PYTHON={python.absolute()}",
                f"KMODKIT_REPO={REPO}",
                f"KMODKIT_DRIVER={kernel_cache / 'driver'}",
            ]
        ),
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ]  # fmt: skip
    done = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=QEMU_TIMEOUT_SECONDS,
        check=False,
    )
    console = done.stdout + done.stderr
    checks: dict[str, Any] = {"console": console[-6000:]}
    for line in console.splitlines():
        if MARKER in line:
            record = json.loads(line[line.index(MARKER) + len(MARKER) :].strip())
            checks[record["name"]] = record
    return checks


pytestmark = pytest.mark.timeout(PREPARE_TIMEOUT_SECONDS + QEMU_TIMEOUT_SECONDS + 60)


@pytest.mark.parametrize("name", CHECKS)
def test_agent_on_a_real_kernel(vm_checks: dict[str, Any], name: str) -> None:
    record = vm_checks.get(name)
    assert record is not None, f"the VM did not report {name}; console:\n{vm_checks['console']}"
    assert record["ok"], json.dumps(record["detail"], indent=2)
