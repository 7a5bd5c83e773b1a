"""The kernel's messages printed while the agent loads a module, from ``/dev/kmsg``.

Best effort and cheap: the agent opens ``/dev/kmsg`` before an insert, skips what
was there already, and after a failure reads what the kernel printed meanwhile (the
signature check's own words). Where ``/dev/kmsg`` cannot be read (no CAP_SYSLOG, no
such device) there are simply no messages; nothing depends on them. The lines are not
filtered by module: another load at the same moment may show up too, so they are
quoted, never parsed for decisions other than the lockdown notice.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Protocol

KMSG = Path("/dev/kmsg")
_RECORD_BYTES = 8192  # a /dev/kmsg read returns one record; it must fit
_MAX_RECORDS = 200  # a failed insert prints a handful; never read a flood to the end


class KernelLog(Protocol):
    def new_lines(self) -> list[str]:
        """The messages printed since the log was opened (or last read)."""
        ...

    def close(self) -> None: ...


def parse_record(record: bytes) -> str:
    """One ``/dev/kmsg`` record (``prio,seq,usec,flags;text`` then ``KEY=value``
    continuation lines, Documentation/ABI/testing/dev-kmsg) to its message text."""
    text = record.decode(errors="replace")
    _, separator, message = text.partition(";")
    return (message if separator else text).split("\n", 1)[0].strip()


class DevKmsg:
    """``/dev/kmsg`` opened at its end; no messages when it cannot be opened."""

    def __init__(self, path: Path = KMSG) -> None:
        self._fd: int | None = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what the kernel prints from now on
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    def new_lines(self) -> list[str]:
        if self._fd is None:
            return []
        lines: list[str] = []
        for _ in range(_MAX_RECORDS):
            try:
                record = os.read(self._fd, _RECORD_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten meanwhile: go on
                    continue
                break
            if not record:
                break
            lines.append(parse_record(record))
        return lines

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def open_kmsg() -> KernelLog:
    return DevKmsg()
