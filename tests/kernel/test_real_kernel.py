"""The node agent against a real Linux kernel, booted under qemu (software emulation).

``prepare.sh`` fetches Debian's current kernel, its headers, qemu and busybox,
builds our test module pair and an initramfs (cached per kernel version). The VM
mounts this machine's root read-only over virtio-9p and runs
``vm_scenario.py`` with this interpreter, so the agent under test is this
checkout. Two boots serve every test here: the plain one (``vm_scenario.py``),
and the signature boot (``vm_signature_scenario.py``: Secure Boot on under OVMF,
``module.sig_enforce=1``, the test signer a Machine Owner Key; the modules it signed are
made by the signing pipeline, ``kmodkit-sign`` against a real registry).
Each test asserts one check a scenario reported on the console.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kmodkit_dev import registry as devregistry
from tests.integration.oci_images import Client, layer_files
from tests.integration.signing_support import Kernel, unsigned_layers

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
# minutes (apt, a 70 MB kernel package) and the VM run about 2 (4 with both cores busy);
# the signature boot about 40 s (OVMF with SMM adds little). Each boot has the QEMU bound.
PREPARE_TIMEOUT_SECONDS = 540
QEMU_TIMEOUT_SECONDS = 480


@pytest.fixture(scope="session")
def kernel_cache() -> Path:
    done = subprocess.run(
        ["sh", str(HERE / "prepare.sh")],
        # prepare.sh finds virt-fw-vars beside this interpreter (the dev extras).
        env={**os.environ, "KMODKIT_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=PREPARE_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"tests/kernel/prepare.sh failed:\n{done.stderr[-4000:]}", pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1])


# The signature boot: Secure Boot on (OVMF's Secure Boot build, our test platform
# key enrolled, the kernel signed with it), the trusted test signer a Machine Owner
# Key, and module.sig_enforce=1 (prepare.sh).
SIGNATURE_CHECKS = [
    "sig_enforce_under_secure_boot",
    "unsigned_refused_with_signature_reason",
    "refusal_names_the_dependency_modprobe_inserted",
    "signed_module_names_our_signer",
    "untrusted_signed_refused",
    "our_key_is_a_trusted_machine_owner_key",
    "trusted_signed_loads",
]
# The Secure Boot build needs SMM, and its variable flash writable only from SMM.
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")


def boot(
    kernel_cache: Path,
    *,
    append: list[str],
    machine: str = "accel=tcg",
    firmware: list[str] | None = None,
    kernel: Path | None = None,
) -> dict[str, Any]:
    """Boot the test kernel once and collect the checks its scenario reported."""
    python = Path(sys.executable)
    for needed in (REPO, python, kernel_cache):
        # The VM covers /run with a tmpfs for its scratch space.
        assert not str(needed.absolute()).startswith("/run/"), f"{needed} is hidden in the VM"
    version = kernel_cache.name
    # Software emulation on purpose: it is what CI machines have (and nested
    # KVM can hang), and this tier's time budget is set for it.
    command = [
        "qemu-system-x86_64",
        "-machine", machine,
        "-cpu", "max",
        "-m", "768",
        "-smp", "1",
        "-nographic",
        "-vga", "none",
        "-nic", "none",
        "-no-reboot",
        *(firmware or []),
        "-kernel", str(kernel or kernel_cache / "image" / "boot" / f"vmlinuz-{version}"),
        "-initrd", str(kernel_cache / "initramfs.cpio.gz"),
        "-append",
        " ".join(
            [
                "console=ttyS0 panic=-1 quiet loglevel=1",
                f"KMODKIT_PYTHON={python.absolute()}",
                f"KMODKIT_REPO={REPO}",
                f"KMODKIT_DRIVER={kernel_cache / 'driver'}",
                *append,
            ]
        ),
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ]  # fmt: skip
    started = time.monotonic()
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
    checks: dict[str, Any] = {
        "console": console[-6000:],
        "seconds": round(time.monotonic() - started),
    }
    for line in console.splitlines():
        if MARKER in line:
            record = json.loads(line[line.index(MARKER) + len(MARKER) :].strip())
            checks[record["name"]] = record
    return checks


@pytest.fixture(scope="module")
def vm_checks(kernel_cache: Path) -> dict[str, Any]:
    return boot(kernel_cache, append=[])


def pipeline_signed(cache: Path, where: Path) -> Path:
    """prepare.sh's signers, with the trusted signer's modules signed by the pipeline.

    The unsigned test modules are pushed as an image to a real registry, and the real
    ``kmodkit-sign`` (what a sign Job runs) signs them with the trusted signer's key and
    pushes the signed image; its top layer's modules are what the VM loads as signed by
    the trusted key. The untrusted signer's modules stay as prepare.sh signed them.
    """
    prepared = cache / "signed"
    signed = where / "signed"
    signed.mkdir()
    for entry in prepared.iterdir():
        if entry.name != "trusted":
            (signed / entry.name).symlink_to(entry)
    version = cache.name
    driver = cache / "driver" / "opt" / "lib" / "modules" / version / "extra"
    kernel = Kernel(
        version,
        (driver / "kmodkit_test_dev.ko").read_bytes(),
        (driver / "kmodkit_test_dep.ko").read_bytes(),
    )
    reg = devregistry.start(where / "registry", "kmodkit", secrets.token_urlsafe(16))
    try:
        Client(reg).push_image("test/unsigned", version, unsigned_layers(kernel))
        config = where / "config.json"
        config.write_text(reg.dockerconfigjson())
        command = [
            sys.executable, "-m", "kmodkit.core.signer.cli",
            "--unsigned-image", f"{reg.host}/test/unsigned:{version}",
            "--image", f"{reg.host}/test/signed:{version}",
            "--file", f"/opt/lib/modules/{version}/extra/kmodkit_test_*.ko",
            "--key", str(prepared / "trusted.key"), "--cert", str(prepared / "trusted.der"),
            "--docker-config", str(config),
        ]  # fmt: skip
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "KMODKIT_REGISTRY_CA": str(reg.ca)},
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        manifest, _ = Client(reg).manifest("test/signed", version)
        top = layer_files(Client(reg).blob("test/signed", manifest["layers"][-1]["digest"]))
    finally:
        reg.stop()
    extra = signed / "trusted" / "opt" / "lib" / "modules" / version / "extra"
    extra.mkdir(parents=True)
    modules = {Path(path).name: content for path, (info, content) in top.items() if info.isfile()}
    assert sorted(modules) == ["kmodkit_test_dep.ko", "kmodkit_test_dev.ko"], sorted(modules)
    for name, content in modules.items():
        assert content is not None
        (extra / name).write_bytes(content)
    return signed


@pytest.fixture(scope="module")
def signature_checks(
    kernel_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    signed = pipeline_signed(kernel_cache, tmp_path_factory.mktemp("pipeline"))
    # OVMF writes to its variable store (boot entries): each boot gets its own copy.
    variables = tmp_path_factory.mktemp("ovmf") / "OVMF_VARS.fd"
    shutil.copyfile(kernel_cache / "signed" / "OVMF_VARS.fd", variables)
    firmware = [
        "-global", "driver=cfi.pflash01,property=secure,value=on",
        "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive", f"if=pflash,format=raw,unit=1,file={variables}",
    ]  # fmt: skip
    return boot(
        kernel_cache,
        machine="q35,smm=on,accel=tcg",
        kernel=kernel_cache / "signed" / "vmlinuz",
        append=[
            "module.sig_enforce=1",
            "KMODKIT_SCENARIO=vm_signature_scenario.py",
            f"KMODKIT_SIGNED={signed}",
        ],
        firmware=firmware,
    )


pytestmark = pytest.mark.timeout(PREPARE_TIMEOUT_SECONDS + QEMU_TIMEOUT_SECONDS + 60)


def assert_reported(checks: dict[str, Any], name: str) -> None:
    record = checks.get(name)
    assert record is not None, f"the VM did not report {name}; console:\n{checks['console']}"
    assert record["ok"], json.dumps(record["detail"], indent=2)


@pytest.mark.parametrize("name", CHECKS)
def test_agent_on_a_real_kernel(vm_checks: dict[str, Any], name: str) -> None:
    assert_reported(vm_checks, name)


@pytest.mark.parametrize("name", SIGNATURE_CHECKS)
def test_signatures_on_a_real_kernel(signature_checks: dict[str, Any], name: str) -> None:
    assert_reported(signature_checks, name)
