"""Runs inside the signature boot of the kernel-tier VM: Secure Boot on, module.sig_enforce=1.

Started by the VM's /init like ``vm_scenario.py`` (KMODKIT_SCENARIO names this file).
OVMF boots the kernel under Secure Boot, and its variable store holds the trusted test
signer's certificate as a Machine Owner Key (prepare.sh);
``KMODKIT_SIGNED`` is prepare.sh's directory of signers and signed modules. Each check
prints one ``KMODKIT-CHECK`` line, as in ``vm_scenario.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# Run as a script from tests/kernel/: the checkout's root makes the shared helpers importable.
sys.path.insert(0, os.environ["KMODKIT_REPO"])
from tests.kernel.vm_scenario import (
    DEP,
    DRIVER,
    TOP,
    WORK,
    agent,
    check,
    events,
    loaded,
)

SIGNED = Path(os.environ["KMODKIT_SIGNED"])
SIGNERS: dict[str, dict[str, str]] = json.loads((SIGNED / "signers.json").read_text())
RELEASE = os.uname().release
FIRMWARE = WORK / "image-firmware"
# The keyrings the kernel checks a module signature against (with Debian's patch for
# the platform keyring), and where each of our routes puts a key.
KEYRINGS = (".builtin_trusted_keys", ".secondary_trusted_keys", ".machine", ".platform")


def image(name: str, variant: str) -> Path:
    """A writable copy of one variant of the test modules (the agent runs depmod in it)."""
    source = DRIVER / "opt" if variant == "unsigned" else SIGNED / variant / "opt"
    target = WORK / name / "opt"
    shutil.copytree(source, target)
    return target


def config(variant: str, *, ordered: bool = True) -> Path:
    """The agent's configuration for one variant: with the pair's loading order, or the
    top module alone (modprobe then inserts the dependency itself)."""
    name = f"{variant}-{'ordered' if ordered else 'alone'}"
    order = {"modulesLoadingOrder": [TOP, DEP]} if ordered else {}
    path = WORK / f"agent-{name}.json"
    path.write_text(
        json.dumps(
            {
                "modprobe": {
                    "moduleName": TOP,
                    "dirName": str(image(name, variant)),
                    **order,
                    "firmwarePath": str(FIRMWARE),
                },
                "version": "1.2.3",
                "firmwareHostPath": "/var/lib/firmware",
            }
        )
    )
    return path


def modinfo(path: Path, field: str) -> str:
    done = subprocess.run(
        ["modinfo", "-F", field, str(path)], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def ko(variant: str, name: str) -> Path:
    return SIGNED / variant / "opt/lib/modules" / RELEASE / "extra" / f"{name}.ko"


def keyrings_holding(signer: str) -> list[str]:
    """The kernel keyrings with a key whose description names ``signer`` (keyctl)."""
    found = []
    for keyring in KEYRINGS:
        done = subprocess.run(
            ["keyctl", "show", f"%:{keyring}"], capture_output=True, text=True, check=False
        )
        if f"{signer}:" in done.stdout:
            found.append(keyring)
    return found


def sig_enforced() -> tuple[bool, object]:
    value = Path("/sys/module/module/parameters/sig_enforce").read_text().strip()
    secure_boot = [line for line in certificate_log() if "ecure boot" in line or "locked" in line]
    facts = {"sig_enforce": value, "secure_boot": secure_boot}
    return value == "Y" and any("Secure boot enabled" in line for line in secure_boot), facts


def refusal(
    variant: str, *, ordered: bool = True
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    code, records = agent("load", config=config(variant, ordered=ordered))
    rejected = events(records, "load.signature_rejected")
    return code, (rejected[0] if rejected else {}), records


def unsigned_refused_with_signature_reason() -> tuple[bool, object]:
    code, rejected, records = refusal("unsigned")
    message = rejected.get("message", "")
    ok = (
        code == 6
        and rejected.get("module") == DEP
        and str(rejected.get("file")).endswith(f"/extra/{DEP}.ko")
        and rejected.get("errno") == "EKEYREJECTED"
        and rejected.get("signed") is False
        and "modinfo: unsigned" in message
        and "Loading of unsigned module is rejected" in rejected.get("kernel_messages", [])
        and DEP not in loaded()
    )
    return ok, ({"exit": code, "rejected": rejected} if ok else {"exit": code, "records": records})


def refusal_names_the_dependency_modprobe_inserted() -> tuple[bool, object]:
    # One modprobe of the top module inserts the dependency first: the refused file is
    # the last one modprobe -v printed before the kernel said no.
    code, rejected, records = refusal("unsigned", ordered=False)
    ok = (
        code == 6
        and rejected.get("module") == DEP
        and str(rejected.get("file")).endswith(f"/extra/{DEP}.ko")
        and rejected.get("argv", [])[-1:] == [TOP]
    )
    return ok, ({"exit": code, "rejected": rejected} if ok else {"exit": code, "records": records})


def signed_module_names_our_signer() -> tuple[bool, object]:
    seen = {
        variant: {
            name: {f: modinfo(ko(variant, name), f) for f in ("signer", "sig_key", "sig_hashalgo")}
            for name in (TOP, DEP)
        }
        for variant in SIGNERS
    }
    ok = all(
        info == {**SIGNERS[variant], "sig_hashalgo": "sha256"}
        for variant, modules in seen.items()
        for info in modules.values()
    )
    return ok, {"expected": SIGNERS, "modinfo": seen}


def untrusted_signed_refused() -> tuple[bool, object]:
    code, rejected, records = refusal("untrusted")
    theirs = SIGNERS["untrusted"]
    message = rejected.get("message", "")
    kernel_said = "Loading of module with unavailable key is rejected"
    ok = (
        code == 6
        and rejected.get("errno") == "EKEYREJECTED"
        and rejected.get("signer") == theirs["signer"]
        and rejected.get("sig_key") == theirs["sig_key"]
        and f'signed by "{theirs["signer"]}" with key {theirs["sig_key"]} (sha256)' in message
        and kernel_said in rejected.get("kernel_messages", [])
        and DEP not in loaded()
    )
    return ok, ({"exit": code, "rejected": rejected} if ok else {"exit": code, "records": records})


def certificate_log() -> list[str]:
    """What the kernel said at boot about the certificates it read from the firmware."""
    done = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
    wanted = ("X.509", "UEFI:", "MokList", "keyring", "ecure boot", "locked down")
    return [line for line in done.stdout.splitlines() if any(w in line for w in wanted)]


def our_key_is_a_trusted_machine_owner_key() -> tuple[bool, object]:
    # A MOK lands in .machine, which the kernel links to .secondary_trusted_keys: the
    # keyring module signatures are checked against.
    trusted = keyrings_holding(SIGNERS["trusted"]["signer"])
    untrusted = keyrings_holding(SIGNERS["untrusted"]["signer"])
    facts = {"trusted": trusted, "untrusted": untrusted, "kernel": certificate_log()}
    return ".machine" in trusted and not untrusted, facts


def trusted_signed_loads() -> tuple[bool, object]:
    code, records = agent("load", config=config("trusted"))
    modules = loaded()
    # The kernel taints with E a module it loaded without a valid signature.
    taint = Path(f"/sys/module/{TOP}/taint").read_text().strip() if TOP in modules else None
    ok = code == 0 and TOP in modules and DEP in modules and taint is not None and "E" not in taint
    facts = {"exit": code, "loaded": [m for m in modules if m in (TOP, DEP)], "taint": taint}
    return ok, (facts if ok else {**facts, "records": records})


def main() -> None:
    (FIRMWARE / "kmodkit-test").mkdir(parents=True)
    (FIRMWARE / "kmodkit-test" / "fw.bin").write_bytes(b"\0" * 64)
    check("sig_enforce_under_secure_boot", sig_enforced)
    check("unsigned_refused_with_signature_reason", unsigned_refused_with_signature_reason)
    check(
        "refusal_names_the_dependency_modprobe_inserted",
        refusal_names_the_dependency_modprobe_inserted,
    )
    check("signed_module_names_our_signer", signed_module_names_our_signer)
    check("untrusted_signed_refused", untrusted_signed_refused)
    check("our_key_is_a_trusted_machine_owner_key", our_key_is_a_trusted_machine_owner_key)
    check("trusted_signed_loads", trusted_signed_loads)
    print("KMODKIT-DONE", flush=True)


if __name__ == "__main__":
    main()
