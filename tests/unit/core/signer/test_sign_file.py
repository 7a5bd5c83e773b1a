"""Finding sign-file, and what is refused before it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmodkit.core.signer.errors import SignerError, UsageError
from kmodkit.core.signer.sign_file import (
    check_hash_algorithm,
    check_module,
    find_sign_file,
    newest,
)

KBUILD = "/usr/lib/linux-kbuild-{}/scripts/sign-file"
HEADERS = "/usr/src/linux-headers-{}/scripts/sign-file"


def test_the_newest_kernel_version_wins_by_number_not_by_text() -> None:
    assert newest([KBUILD.format("6.9"), KBUILD.format("6.10"), KBUILD.format("6.1")]) == (
        KBUILD.format("6.10")
    )


def test_sign_file_on_path_comes_before_the_debian_packages() -> None:
    def matches(pattern: str) -> list[str]:
        if "kbuild" in pattern:
            return [KBUILD.format("6.1")]
        return [HEADERS.format("6.12.0-1-amd64")]

    assert find_sign_file(None, lambda _: "/usr/bin/sign-file", matches) == Path(
        "/usr/bin/sign-file"
    )
    assert find_sign_file(None, lambda _: None, matches) == Path(HEADERS.format("6.12.0-1-amd64"))


def test_no_sign_file_anywhere_says_what_to_install() -> None:
    with pytest.raises(SignerError, match=r"install Debian's linux-kbuild-<version>.*--sign-file"):
        find_sign_file(None, lambda _: None, lambda _: [])


def test_a_given_sign_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--sign-file .* does not exist"):
        find_sign_file(str(tmp_path / "nothing"))
    given = tmp_path / "sign-file"
    given.write_text("")
    assert find_sign_file(str(given)) == given


def test_only_hash_algorithms_the_kernel_verifies_are_taken() -> None:
    assert check_hash_algorithm("sha512") == "sha512"
    with pytest.raises(UsageError, match="--hash-algo 'md5' is not one the kernel verifies"):
        check_hash_algorithm("md5")


def test_a_file_that_is_not_elf_is_not_signed() -> None:
    check_module("/x.ko", b"\x7fELF\x02\x01")
    with pytest.raises(SignerError, match=r"/x\.ko in the image is not an ELF kernel module"):
        check_module("/x.ko", b"#!/bin/sh\n")
