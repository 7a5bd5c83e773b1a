"""Reading the kernel's messages from /dev/kmsg (kmodkit.agent.kmsg)."""

from __future__ import annotations

from pathlib import Path

from kmodkit.agent.kmsg import DevKmsg, parse_record


def test_a_record_is_its_text_without_header_or_dictionary() -> None:
    record = b"5,1234,99887766,-;Loading of unsigned module is rejected\n SUBSYSTEM=module\n"
    assert parse_record(record) == "Loading of unsigned module is rejected"
    # A text with its own semicolons keeps them.
    assert parse_record(b"6,1,2,-;a; b\n") == "a; b"
    assert parse_record(b"no header at all\n") == "no header at all"


def test_only_what_is_written_after_opening_is_read(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1,-;old message\n")
    kmsg = DevKmsg(log)
    try:
        assert kmsg.new_lines() == []
        with log.open("ab") as out:
            out.write(b"5,2,2,-;Loading of unsigned module is rejected\n")
        assert kmsg.new_lines() == ["Loading of unsigned module is rejected"]
        assert kmsg.new_lines() == []
    finally:
        kmsg.close()
    kmsg.close()  # twice is harmless


def test_no_device_means_no_messages(tmp_path: Path) -> None:
    kmsg = DevKmsg(tmp_path / "absent")
    assert kmsg.new_lines() == []
    kmsg.close()
