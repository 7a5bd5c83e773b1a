"""Fixtures that give tests a real control plane and a real OCI registry.

The cluster starts once per test session, on first use, so pure unit tests
never pay for it. If it cannot start, every test that needs it errors loudly:
nothing is skipped and nothing is faked.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kmodkit_dev import cluster as devcluster
from kmodkit_dev import registry as devregistry

CLUSTER_NAME = f"pytest-{os.getpid()}"
TESTS = Path(__file__).parent
# Per-tier limits, so a hung pure test fails in seconds instead of waiting out
# the cluster tiers' limit. A test's own timeout marker wins.
TIER_TIMEOUTS = {"unit": 15, "node": 30, "packaging": 120, "integration": 600, "e2e": 900}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        tier = item.path.relative_to(TESTS).parts[0]
        if (limit := TIER_TIMEOUTS.get(tier)) is not None:
            item.add_marker(pytest.mark.timeout(limit))


@pytest.fixture(scope="session")
def dev_cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.Cluster]:
    capture: Any = request.config.pluginmanager.get_plugin("capturemanager")

    def say(msg: str) -> None:
        # Shown even under output capture: a reader of the test log must see
        # that a real apiserver served these tests.
        with capture.global_and_fixture_disabled():
            print(f"\n{msg}", flush=True)

    c = devcluster.up(CLUSTER_NAME, nodes=6, profile="mixed", echo=say)
    try:
        from kubernetes import client

        info = client.VersionApi(devcluster.api_client(c)).get_code()
        say(f"integration tests run against kube-apiserver {info.git_version} at {c.server}")
        yield c
    finally:
        devcluster.down(CLUSTER_NAME, echo=say)


@pytest.fixture(scope="session")
def kubeconfig(dev_cluster: devcluster.Cluster) -> str:
    return str(dev_cluster.kubeconfig)


@pytest.fixture(scope="session")
def kube_api(dev_cluster: devcluster.Cluster) -> Any:
    return devcluster.api_client(dev_cluster)


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    yield from temporary_namespace(kube_api)


def temporary_namespace(kube_api: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted after it, once its default service account
    exists (until then the apiserver refuses a pod that names none)."""
    from kubernetes import client

    from kmodkit_dev.waiting import wait_until

    name = f"t-{uuid.uuid4().hex[:10]}"
    core: Any = client.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name}})
    wait_until(
        lambda: (
            core.list_namespaced_service_account(name, field_selector="metadata.name=default").items
        ),
        f"namespace {name}'s default service account",
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devregistry.Registry]:
    workdir: Path = tmp_path_factory.mktemp("registry")
    reg = devregistry.start(workdir, "kmodkit", secrets.token_urlsafe(16), tls=True)
    yield reg
    reg.stop()
