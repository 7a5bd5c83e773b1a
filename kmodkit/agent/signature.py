"""Telling a module the kernel refused for its signature from any other failed load.

Pure: the agent hands in what modprobe/insmod printed, the kernel's messages printed
meanwhile and what ``modinfo`` says of the file; this module decides whether the
kernel refused the signature and words the failure.

What the kernel returns (kernel/module/signing.c, ``module_sig_check``): with
``module.sig_enforce=1`` (or CONFIG_MODULE_SIG_FORCE) an unsigned module, one signed
with a key no trusted keyring holds, or one with unsupported crypto, is refused with
EKEYREJECTED and the notice "Loading of <what> is rejected"; a signature that does not
verify is EKEYREJECTED whatever the setting, and one that cannot be parsed EBADMSG.
Kernels before 4.x returned ENOKEY for the unknown key, and ENOPKG for unsupported
crypto. Without enforcement, a kernel locked down by Secure Boot refuses the same
modules with EPERM and "Lockdown: <comm>: unsigned module loading is restricted".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# strerror() of each errno, as kmod's tools print it after "could not insert ...: ".
_ALWAYS_SIGNATURE = {
    "Key was rejected by service": "EKEYREJECTED",
    "Required key not available": "ENOKEY",
}
# These two also come from other places than the signature check, so they count only
# when the file carries a signature the kernel had to parse.
_WHEN_SIGNED = {
    "Bad message": "EBADMSG",
    "Package not installed": "ENOPKG",
}
_LOCKDOWN = re.compile(r"Lockdown: .*unsigned module loading is restricted")
# Kernel messages worth quoting: the refusal notice, lockdown, and the PKCS#7/X.509
# verifier's complaints.
_KERNEL_SIGNATURE_LINE = re.compile(
    r"is rejected|Lockdown:|PKCS#7|X\.509|signature|module verification", re.IGNORECASE
)
# modprobe -v prints "insmod <path> [params]" before each insert: the last one failed.
_INSMOD_LINE = re.compile(r"^insmod (\S+)", re.MULTILINE)
_QUOTED_LIMIT = 3


@dataclass(frozen=True)
class ModuleSignature:
    """What ``modinfo`` reads from the signature appended to a ``.ko`` (all empty: none)."""

    signer: str = ""
    sig_key: str = ""
    hash_algo: str = ""
    sig_id: str = ""

    @property
    def signed(self) -> bool:
        return bool(self.signer or self.sig_key or self.sig_id)

    def describe(self) -> str:
        if not self.signed:
            return "unsigned"
        signer = f'"{self.signer}"' if self.signer else "an unnamed signer"
        key = f" with key {self.sig_key}" if self.sig_key else ""
        algo = f" ({self.hash_algo})" if self.hash_algo else ""
        return f"signed by {signer}{key}{algo}"


@dataclass(frozen=True)
class Refusal:
    """The kernel refused a module's signature: the errno and the kernel's own words."""

    errno: str
    strerror: str
    kernel_lines: tuple[str, ...]


def signature_refusal(
    output: str, kernel_lines: Sequence[str], signature: ModuleSignature | None = None
) -> Refusal | None:
    """Whether a failed insert (``output``: the tool's stderr and stdout) was the kernel
    refusing the module's signature. ``signature`` is the file's, when known."""
    quoted = tuple(line for line in kernel_lines if _KERNEL_SIGNATURE_LINE.search(line))
    quoted = quoted[-_QUOTED_LIMIT:]
    for text, errno in _ALWAYS_SIGNATURE.items():
        if text in output:
            return Refusal(errno, text, quoted)
    if signature is not None and signature.signed:
        for text, errno in _WHEN_SIGNED.items():
            if text in output:
                return Refusal(errno, text, quoted)
    # EPERM alone is also "not root" or a seccomp filter: only the kernel's lockdown
    # notice makes it a signature refusal.
    if "Operation not permitted" in output and any(_LOCKDOWN.search(line) for line in quoted):
        return Refusal("EPERM", "Operation not permitted", quoted)
    return None


def may_be_refusal(output: str, kernel_lines: Sequence[str]) -> bool:
    """Whether the failure is a signature refusal for some file: worth asking modinfo."""
    return signature_refusal(output, kernel_lines, _ANY_SIGNED) is not None


_ANY_SIGNED = ModuleSignature(sig_id="PKCS#7")


def refused_file(stdout: str) -> str | None:
    """The file modprobe -v was inserting when it failed (it prints each before inserting)."""
    found = _INSMOD_LINE.findall(stdout)
    return found[-1] if found else None


def module_of(file: str) -> str:
    """The kernel's name for the module a ``.ko`` file holds (as modprobe names it)."""
    base = file.rsplit("/", 1)[-1]
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def refusal_message(
    module: str, file: str | None, refusal: Refusal, signature: ModuleSignature
) -> str:
    """The failure as the loader pod's status shows it: what the kernel refused, what the
    file carries, and what to do about it."""
    where = f" ({file})" if file else ""
    said = "".join(f'; the kernel said "{line}"' for line in refusal.kernel_lines)
    head = (
        f"the kernel refused the signature of module {module}{where}: "
        f"{refusal.strerror} ({refusal.errno}){said}; modinfo: {signature.describe()}"
    )
    if not signature.signed:
        advice = (
            "sign the module (scripts/sign-file) with a key the kernel trusts: one "
            "enrolled as a Machine Owner Key (mokutil --import <cert.der>, confirmed at the "
            "next boot) or the kernel's own build key"
        )
    else:
        advice = (
            "that key is not one the kernel trusts: enrol its certificate as a Machine "
            "Owner Key (mokutil --import <cert.der>, confirmed at the next boot) or sign the "
            "module with a key the kernel already trusts"
        )
    return f"{head}. To load it, {advice}"
