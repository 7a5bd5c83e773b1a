"""The devcluster apiserver's audit log (``cluster.log("audit")``), as tests read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def requests(log: str | Path, user: str) -> list[dict[str, Any]]:
    """``user``'s requests, one record each (its last stage recorded), in order.

    A request is logged at each stage it reached: a watch when its response starts and
    again when it ends, so one still open has only the first.
    """
    needle = f'"username":"{user}"'
    last: dict[str, dict[str, Any]] = {}
    for line in Path(log).read_text(errors="replace").splitlines():
        if needle in line:
            record = json.loads(line)
            last[record["auditID"]] = record
    return list(last.values())
