"""One JSON object per line: the agent's only output format.

Loader pod logs are read by people under pressure and by tooling; a line per
action with stable keys serves both. ``event`` names what happened, the other
keys are its facts.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO


class EventLog:
    def __init__(self, command: str, stream: TextIO | None = None) -> None:
        self._command = command
        self._stream = stream if stream is not None else sys.stdout

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        record = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": level,
            "command": self._command,
            "event": event,
            **fields,
        }
        self._stream.write(json.dumps(record, default=str, sort_keys=False) + "\n")
        self._stream.flush()
