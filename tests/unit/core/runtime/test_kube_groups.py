"""The write client's API groups are made on first use (or ``warm``), not with the
client: their modules take about a second of CPU to import, which an operator's
start spends while its informers list the fleet."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
from kubernetes import client
from kmodkit.core.runtime.kube import Kube

GROUPS = ("core_v1_api", "batch_v1_api", "apps_v1_api")
loaded = lambda: [g for g in GROUPS if f"kubernetes.client.api.{g}" in sys.modules]
kube = Kube(client.ApiClient())
print("made", loaded())
kube.warm()
print("warmed", loaded())
print("same", kube.core is kube.core and kube.events is kube.events)
"""


def test_the_api_groups_are_imported_when_warmed_not_when_the_client_is_made() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out == [
        "made []",
        "warmed ['core_v1_api', 'batch_v1_api', 'apps_v1_api']",
        "same True",
    ]
