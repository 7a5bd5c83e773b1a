"""Host binaries are replaced atomically: readers see the old or the new file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from kmodkit.agent.atomic_file import install_file
from kmodkit.agent.cli import main

OLD = b"#!old tt-smi\n" + b"o" * 300_000
NEW = b"#!new tt-smi\n" + b"n" * 200_000


def test_a_concurrent_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(OLD)
    new.write_bytes(NEW)
    target = tmp_path / "host/usr/local/bin/tt-smi"
    install_file(old, target, 0o755)

    stop = threading.Event()
    seen: list[bytes] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            content = target.read_bytes()
            reads += 1
            if content not in (OLD, NEW):
                seen.append(content[:40])

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_ in range(60):
            install_file(new if round_ % 2 == 0 else old, target, 0o755)
    finally:
        stop.set()
        thread.join()

    assert seen == []
    assert reads > 60
    assert target.read_bytes() == OLD


def test_installs_with_mode_and_leaves_no_staging_files(tmp_path: Path) -> None:
    source = tmp_path / "tt-smi"
    source.write_bytes(NEW)
    target = tmp_path / "bin/tt-smi"

    assert install_file(source, target, 0o755) is True

    assert target.read_bytes() == NEW
    assert target.stat().st_mode & 0o7777 == 0o755
    assert os.listdir(target.parent) == ["tt-smi"]


def test_an_identical_file_is_left_alone(tmp_path: Path) -> None:
    source = tmp_path / "tt-smi"
    source.write_bytes(NEW)
    target = tmp_path / "bin/tt-smi"
    install_file(source, target, 0o755)
    inode = target.stat().st_ino

    assert install_file(source, target, 0o755) is False
    assert target.stat().st_ino == inode
    assert install_file(source, target, 0o700) is True


def test_a_failed_copy_keeps_the_old_file_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "bin/tt-smi"
    target.parent.mkdir()
    target.write_bytes(OLD)

    with pytest.raises(FileNotFoundError):
        install_file(tmp_path / "missing", target, 0o755)

    assert target.read_bytes() == OLD
    assert os.listdir(target.parent) == ["tt-smi"]


def test_install_file_command(tmp_path: Path) -> None:
    source = tmp_path / "tt-smi"
    source.write_bytes(NEW)
    host = tmp_path / "host"
    host.mkdir()
    args = ["--host-root", str(host), "install-file", str(source), "/usr/local/bin/tt-smi"]

    first = CliRunner().invoke(main, args)
    second = CliRunner().invoke(main, [*args[:-2], str(source), "/usr/local/bin/tt-smi"])

    assert first.exit_code == 0, first.output
    assert (host / "usr/local/bin/tt-smi").read_bytes() == NEW
    assert '"event": "host_file.installed"' in first.output
    assert '"event": "host_file.unchanged"' in second.output
    bad = CliRunner().invoke(main, [*args, "--mode", "rwx"])
    assert bad.exit_code == 2
