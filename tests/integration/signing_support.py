"""What the signing tests share: our test modules, a signing key, an unsigned driver image."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.oci_images import Member, layer

REPO = Path(__file__).resolve().parents[2]
SIGNER_CN = "kmodkit test signing key"
MAGIC = b"~Module signature appended~\n"
"""What ends a signed module."""


@dataclass(frozen=True)
class Kernel:
    version: str
    dev: bytes  # kmodkit_test_dev.ko
    dep: bytes  # kmodkit_test_dep.ko


@dataclass(frozen=True)
class Keys:
    key: Path
    cert: Path
    pem: bytes
    der: bytes
    serial: str  # as modinfo prints sig_key


def prepare_kernel() -> Kernel:
    """The test module pair built against the current Debian kernel's headers (which bring
    sign-file), by tests/kernel/prepare.sh."""
    done = subprocess.run(
        ["sh", str(REPO / "tests/kernel/prepare.sh"), "modules"],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"tests/kernel/prepare.sh modules failed:\n{done.stderr[-4000:]}")
    cache = Path(done.stdout.strip().splitlines()[-1])
    driver = cache / "driver"
    return Kernel(
        cache.name,
        (driver / "kmodkit_test_dev.ko").read_bytes(),
        (driver / "kmodkit_test_dep.ko").read_bytes(),
    )


def make_keys(where: Path) -> Keys:
    """A fresh RSA signing key and self-signed certificate in ``where``."""
    key, cert = where / "key.pem", where / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
         "-subj", f"/CN={SIGNER_CN}/O=kmodkit tests", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    der = subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-outform", "DER"], check=True, capture_output=True
    ).stdout
    serial = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-serial"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    hex_serial = serial.split("=", 1)[1]
    hex_serial = hex_serial.zfill(len(hex_serial) + len(hex_serial) % 2)
    return Keys(key, cert, key.read_bytes(), der, ":".join(re.findall("..", hex_serial)))


def extra_dir(kernel: Kernel) -> str:
    return f"opt/lib/modules/{kernel.version}/extra"


def unsigned_layers(kernel: Kernel) -> list[bytes]:
    """Two layers: the modules (one later deleted), then a whiteout and more files."""
    extra = extra_dir(kernel)
    base = layer(
        [
            Member("etc", None, 0o755),
            Member("etc/os-release", b"ID=debian\n"),
            Member("opt", None, 0o755),
            Member("opt/lib", None, 0o755),
            Member("opt/lib/modules", None, 0o755),
            Member(f"opt/lib/modules/{kernel.version}", None, 0o755),
            Member(extra, None, 0o750, uid=1000, gid=1001),
            Member(f"{extra}/kmodkit_test_dev.ko", kernel.dev, 0o640, uid=1000, gid=1001),
            Member(f"{extra}/kmodkit_test_dep.ko", kernel.dep, 0o644),
            Member(f"{extra}/old.ko", kernel.dep, 0o644),
            Member("opt/README", b"not a module\n"),
        ]
    )
    top = layer(
        [
            Member(f"{extra}/.wh.old.ko", b""),
            Member(
                f"opt/lib/modules/{kernel.version}/modules.dep", b"extra/kmodkit_test_dev.ko:\n"
            ),
        ]
    )
    return [base, top]


def no_key_in(data: bytes, keys: Keys, what: str) -> None:
    """Neither the PEM text, nor a line of it, nor any 32 bytes of the key's DER, raw or
    in hex (base64 of it is the PEM's lines)."""
    assert keys.pem not in data, f"the PEM key is in {what}"
    for line in keys.pem.splitlines():
        if len(line) >= 32 and not line.startswith(b"-----"):
            assert line not in data, f"a line of the PEM key is in {what}"
    lowered = data.lower()
    for start in range(0, len(keys.der) - 32, 8):
        window = keys.der[start : start + 32]
        assert window not in data, f"bytes of the DER key are in {what}"
        assert window.hex().encode() not in lowered, f"the DER key in hex is in {what}"


def modinfo(where: Path, content: bytes, field: str) -> str:
    """``modinfo -F field`` of a module's bytes, written to ``where``."""
    where.write_bytes(content)
    return subprocess.run(
        ["modinfo", "-F", field, str(where)], check=True, capture_output=True, text=True
    ).stdout.strip()
