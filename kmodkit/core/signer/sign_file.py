"""The kernel's ``sign-file``: where it is, and one module signed with it.

``sign-file`` (scripts/sign-file.c in the kernel tree; Debian ships it in
``linux-kbuild-<version>``) appends a PKCS#7 signature and the
``~Module signature appended~`` magic, which is what the kernel and ``modinfo``
read. It is the only process that opens the private key. It runs with an
argument list, never through a shell, and its input is read from /dev/null so
a key with a passphrase fails instead of waiting for one.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from kmodkit.core.signer.errors import SignerError, UsageError

MAGIC = b"~Module signature appended~\n"
ELF_MAGIC = b"\x7fELF"
# The algorithms the kernel's module signing accepts (CONFIG_MODULE_SIG_SHA*).
HASH_ALGORITHMS = (
    "sha1",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "sha3-256",
    "sha3-384",
    "sha3-512",
)
SEARCHED = (
    "/usr/lib/linux-kbuild-*/scripts/sign-file",
    "/usr/src/linux-headers-*/scripts/sign-file",
)
TIMEOUT_SECONDS = 120
_STDERR_LINES = 8


def check_hash_algorithm(name: str) -> str:
    if name not in HASH_ALGORITHMS:
        raise UsageError(
            f"--hash-algo {name!r} is not one the kernel verifies; use one of "
            + ", ".join(HASH_ALGORITHMS)
        )
    return name


def find_sign_file(
    given: str | None,
    which: Callable[[str], str | None] = shutil.which,
    matches: Callable[[str], Iterable[str]] = glob.glob,
) -> Path:
    """``given``, else ``sign-file`` on PATH, else the newest one Debian's packages install."""
    if given:
        path = Path(given)
        if not path.is_file():
            raise UsageError(f"--sign-file {given} does not exist; give the path of sign-file")
        return path
    on_path = which("sign-file")
    if on_path:
        return Path(on_path)
    found = [path for pattern in SEARCHED for path in matches(pattern)]
    if not found:
        raise SignerError(
            "no sign-file found on PATH or in " + " or ".join(SEARCHED) + "; install Debian's "
            "linux-kbuild-<version> (it ships scripts/sign-file) or give --sign-file PATH"
        )
    return Path(newest(found))


def newest(paths: Iterable[str]) -> str:
    """The path with the highest kernel version in it: 6.10 is newer than 6.9."""
    return max(paths, key=lambda p: [int(n) for n in re.findall(r"\d+", p)] + [0])


def check_module(path: str, content: bytes) -> None:
    """Refuse what sign-file would sign into a module the kernel cannot load."""
    if not content.startswith(ELF_MAGIC):
        raise SignerError(
            f"{path} in the image is not an ELF kernel module (it does not start with "
            "the ELF magic); list only .ko files in --file"
        )


def sign(
    sign_file: Path, hash_algorithm: str, key: Path, cert: Path, module: Path, signed: Path
) -> bytes:
    """Sign ``module`` into ``signed`` and return the signed content."""
    try:
        done = subprocess.run(
            [str(sign_file), hash_algorithm, str(key), str(cert), str(module), str(signed)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SignerError(f"{sign_file} did not finish in {TIMEOUT_SECONDS}s") from None
    except OSError as e:
        raise SignerError(f"cannot run {sign_file}: {e.strerror}") from None
    if done.returncode != 0:
        raise SignerError(
            f"{sign_file} failed (exit {done.returncode}): {_tail(done.stderr)}; check that "
            "--key is the private key of --cert, unencrypted, in PEM or DER"
        )
    content = signed.read_bytes()
    if not content.endswith(MAGIC):
        raise SignerError(f"{sign_file} wrote no module signature (the magic is missing)")
    return content


def _tail(stderr: bytes) -> str:
    # sign-file prints OpenSSL's error queue: codes and paths, never key material.
    lines = [
        "".join(c if c.isprintable() else "?" for c in line)
        for line in stderr.decode("utf-8", "replace").splitlines()
        if line.strip()
    ]
    return " | ".join(lines[-_STDERR_LINES:]) or "no message"
