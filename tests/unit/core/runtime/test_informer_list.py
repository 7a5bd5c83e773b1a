"""An informer's list: its items are given the list's apiVersion and kind, which the API
leaves out of a list's items but puts in every watch event's object, so a view reads the
same whichever brought it (pruning an owned object names its kind). The lister is a
stand-in answering one page as the apiserver would."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kmodkit.core.runtime.informer import Informer


class Page:
    """Stands in for the HTTP client's response to a list call."""

    status_code = 200

    def __init__(self, body: dict[str, Any]) -> None:
        self._raw = json.dumps(body).encode()

    async def aread(self) -> bytes:
        return self._raw

    async def aclose(self) -> None:
        pass


def test_a_lists_items_are_given_its_kind() -> None:
    listed = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSetList",
        "metadata": {"resourceVersion": "7"},
        "items": [{"metadata": {"name": "plugin", "namespace": "ns"}}],
    }

    async def lister(**_: Any) -> Page:
        return Page(listed)

    async def run() -> Informer[dict[str, Any]]:
        informer: Informer[dict[str, Any]] = Informer("sets", lister, view=dict)
        await informer._list()
        return informer

    informer = asyncio.run(run())
    assert informer.views() == {
        ("ns", "plugin"): {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "plugin", "namespace": "ns"},
        }
    }
