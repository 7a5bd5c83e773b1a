"""A Module's pull secret as the controller reads it, and what status says when it is bad.

The Kube here is a stand-in that serves one Secret and records status writes
(no API server), and the registry check is replaced by a recorder: these tests
pin which login the controller hands the registry client and what a user reads
in status, not the network (tests/integration/test_registry.py asks a real
registry).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest

from kmodkit.core.api import RegistryTLS
from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Credentials, Existence
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime import module_controller
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import WritePool
from tests.unit.examples import minimal

NS, SECRET, KERNEL = "drivers", "pull", "6.8.0-45-generic"
IMAGE = f"quay.io/org/mod:{KERNEL}"
PASSWORD = "hunter2-pw"


class SecretKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: one Secret, recorded status writes."""

    def __init__(self, data: dict[str, str] | None) -> None:
        # One write at a time, as recorded: the order the pass hands them over.
        self.writes = WritePool(1, api_message)
        self.data = data
        self.statuses: list[Mapping[str, Any]] = []

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.data if (namespace, name) == (NS, SECRET) else None

    def write_status(self, *args: Any) -> None:
        self.statuses.append(args[-1])

    def label_node(self, node: str, change: Mapping[str, str | None]) -> None:
        pass


def _controller(
    kube: SecretKube, monkeypatch: pytest.MonkeyPatch
) -> tuple[ModuleController, list[Credentials | None]]:
    asked: list[Credentials | None] = []

    def recorded_check(
        image: str, credentials: Credentials | None, tls: RegistryTLS | None, *_: Any
    ) -> Answer:
        asked.append(credentials)
        return Answer(Existence.UNKNOWN, "registry quay.io answered HTTP 503")

    monkeypatch.setattr(module_controller, "check", recorded_check)
    shared = Shared(kube=kube, operator_namespace="kmodkit-system", nodes_synced=True)  # type: ignore[arg-type]
    shared.nodes["a"] = NodeView("a", {}, KERNEL)
    controller = ModuleController(
        shared,
        ModuleControllerSettings(
            loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
            build=BuildSettings(builder_image="registry.example.com/builder:1"),
        ),
    )
    return controller, asked


def _body() -> dict[str, Any]:
    body = minimal()
    body["metadata"]["namespace"] = NS
    body["spec"]["imageRepoSecret"] = {"name": SECRET}
    return body


def _reconcile(
    data: dict[str, str] | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[SecretKube, list[Credentials | None]]:
    kube = SecretKube(data)
    controller, asked = _controller(kube, monkeypatch)
    controller.reconcile(_body(), [], [])
    return kube, asked


def _progressing(kube: SecretKube) -> str:
    status = kube.statuses[-1]
    return next(c["message"] for c in status["conditions"] if c["type"] == "Progressing")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_dockercfg_secret_gives_its_login(monkeypatch: pytest.MonkeyPatch) -> None:
    old_format = {"quay.io": {"auth": _b64(f"robot:{PASSWORD}")}}
    _, asked = _reconcile({".dockercfg": _b64(json.dumps(old_format))}, monkeypatch)
    assert asked == [Credentials("robot", PASSWORD)]


def test_a_missing_secret_asks_without_a_login(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, asked = _reconcile(None, monkeypatch)
    assert asked == [None]
    # A registry fault reaches status, once, with the image it is about.
    assert _progressing(kube) == (
        f"1 nodes loading, updating or waiting for an image; cannot tell yet whether {IMAGE} "
        "exists: registry quay.io answered HTTP 503"
    )


def test_a_malformed_secret_is_reported_by_name_and_the_registry_not_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube, asked = _reconcile({".dockerconfigjson": _b64(f'{{"auths": {PASSWORD}')}, monkeypatch)
    assert asked == []
    message = _progressing(kube)
    assert (
        f"cannot tell yet whether {IMAGE} exists: pull secret {NS}/{SECRET} is malformed: "
        ".dockerconfigjson is not JSON" in message
    )
    assert "kubectl create secret docker-registry" in message
    assert PASSWORD not in message


def test_a_fixed_secret_is_used_on_the_next_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = SecretKube({".dockerconfigjson": _b64("not json")})
    controller, asked = _controller(kube, monkeypatch)
    controller.reconcile(_body(), [], [])
    assert asked == []
    fixed = {"auths": {"quay.io": {"username": "robot", "password": PASSWORD}}}
    kube.data = {".dockerconfigjson": _b64(json.dumps(fixed))}
    controller.reconcile(_body(), [], [])
    assert asked == [Credentials("robot", PASSWORD)]
