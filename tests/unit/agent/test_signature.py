"""Telling a signature refusal from other failed loads (kmodkit.agent.signature)."""

from __future__ import annotations

import pytest

from kmodkit.agent.signature import (
    ModuleSignature,
    Refusal,
    may_be_refusal,
    module_of,
    refusal_message,
    refused_file,
    signature_refusal,
)

SIGNED = ModuleSignature(
    signer="kmodkit test signer", sig_key="1A:2B:3C", hash_algo="sha256", sig_id="PKCS#7"
)
UNSIGNED = ModuleSignature()


def insmod_error(strerror: str) -> str:
    return f"insmod: ERROR: could not insert module /opt/x.ko: {strerror}\n"


@pytest.mark.parametrize(
    ("strerror", "errno"),
    [("Key was rejected by service", "EKEYREJECTED"), ("Required key not available", "ENOKEY")],
)
def test_key_errors_are_refusals_whatever_the_file(strerror: str, errno: str) -> None:
    refusal = signature_refusal(insmod_error(strerror), [], UNSIGNED)
    assert refusal == Refusal(errno, strerror, ())


@pytest.mark.parametrize(
    ("strerror", "errno"), [("Bad message", "EBADMSG"), ("Package not installed", "ENOPKG")]
)
def test_parse_errors_are_refusals_only_for_a_signed_file(strerror: str, errno: str) -> None:
    output = insmod_error(strerror)
    assert signature_refusal(output, [], SIGNED) == Refusal(errno, strerror, ())
    # An unsigned file has no signature to parse: the error came from elsewhere.
    assert signature_refusal(output, [], UNSIGNED) is None
    assert signature_refusal(output, [], None) is None
    assert may_be_refusal(output, [])


def test_eperm_is_a_refusal_only_with_the_lockdown_notice() -> None:
    output = insmod_error("Operation not permitted")
    notice = "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"
    assert signature_refusal(output, [], UNSIGNED) is None
    assert signature_refusal(output, ["Lockdown: bpf: use of bpf is restricted"], None) is None
    refusal = signature_refusal(output, [notice], UNSIGNED)
    assert refusal is not None and refusal.errno == "EPERM"
    assert refusal.kernel_lines == (notice,)


@pytest.mark.parametrize(
    "strerror",
    [
        "Unknown symbol in module",
        "No such file or directory",
        "Invalid module format",
        "File exists",
        "Invalid argument",
    ],
)
def test_other_load_failures_are_not_refusals(strerror: str) -> None:
    output = insmod_error(strerror)
    assert signature_refusal(output, ["Loading of unsigned module is rejected"], SIGNED) is None
    assert not may_be_refusal(output, [])


def test_only_the_kernels_signature_lines_are_quoted_the_last_three() -> None:
    lines = [
        "e1000: eth0 NIC Link is Up",
        "PKCS#7 signature not signed with a trusted key",
        "X.509: Cert 1 is blacklisted",
        "module verification failed: signature and/or required key missing",
        "Loading of module with unavailable key is rejected",
        "usb 1-1: new high-speed USB device",
    ]
    refusal = signature_refusal(insmod_error("Key was rejected by service"), lines, SIGNED)
    assert refusal is not None
    assert refusal.kernel_lines == (
        "X.509: Cert 1 is blacklisted",
        "module verification failed: signature and/or required key missing",
        "Loading of module with unavailable key is rejected",
    )


def test_the_refused_file_is_the_last_insert_modprobe_printed() -> None:
    stdout = (
        "insmod /opt/lib/modules/6.1/extra/dep.ko \ninsmod /opt/lib/modules/6.1/extra/top.ko a=1\n"
    )
    assert refused_file(stdout) == "/opt/lib/modules/6.1/extra/top.ko"
    assert refused_file("insmod /opt/lib/modules/6.1/extra/dep.ko\n") == (
        "/opt/lib/modules/6.1/extra/dep.ko"
    )
    assert refused_file("") is None


@pytest.mark.parametrize(
    ("file", "module"),
    [
        ("/a/b/kmodkit_test_dep.ko", "kmodkit_test_dep"),
        ("/a/b/snd-hda-intel.ko.xz", "snd_hda_intel"),
        ("x.ko.zst", "x"),
    ],
)
def test_module_of_a_file(file: str, module: str) -> None:
    assert module_of(file) == module


def test_signature_descriptions() -> None:
    assert UNSIGNED.describe() == "unsigned"
    assert not UNSIGNED.signed
    assert SIGNED.describe() == 'signed by "kmodkit test signer" with key 1A:2B:3C (sha256)'
    assert ModuleSignature(sig_id="PKCS#7").describe() == "signed by an unnamed signer"


def test_message_for_an_unsigned_module_says_so_and_what_to_do() -> None:
    refusal = Refusal(
        "EKEYREJECTED", "Key was rejected by service", ("Loading of unsigned module is rejected",)
    )
    message = refusal_message("dep", "/opt/dep.ko", refusal, UNSIGNED)
    assert message.startswith(
        "the kernel refused the signature of module dep (/opt/dep.ko): "
        "Key was rejected by service (EKEYREJECTED); "
        'the kernel said "Loading of unsigned module is rejected"; modinfo: unsigned. '
    )
    assert "sign the module" in message and "Machine Owner Key" in message


def test_message_for_a_signed_module_names_the_signer_and_key() -> None:
    refusal = Refusal("EKEYREJECTED", "Key was rejected by service", ())
    message = refusal_message("top", None, refusal, SIGNED)
    assert 'modinfo: signed by "kmodkit test signer" with key 1A:2B:3C (sha256).' in message
    assert "module top:" in message
    assert "enrol its certificate as a Machine Owner Key (mokutil --import" in message
