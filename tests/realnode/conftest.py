"""A devcluster with a real node (kubelet and containerd in a qemu VM, see
kmodkit_dev.realnode) and the registry that node pulls from, once per session.

This ``dev_cluster`` replaces the session cluster of tests/conftest.py for the
tests in this directory, and so do ``kube_api``, ``kubeconfig`` and ``namespace``: pytest keeps a
session fixture's value once made, so tests/conftest.py's ``kube_api``, made
earlier in a whole run for the kwok cluster, would stay bound to that cluster.
Two kwok nodes run beside the real node, as in every devcluster.
On a failure, the node's logs (VM console, its init, containerd, kubelet) are
printed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import cluster as devcluster
from kmodkit_dev import images as product_images
from kmodkit_dev import realnode
from kmodkit_dev.registry import Registry
from tests.conftest import temporary_namespace
from tests.realnode import images

CLUSTER_NAME = f"pytest-realnode-{os.getpid()}"
ROOT = Path(__file__).resolve().parents[2]
BUILD_BASE = ROOT / "tests" / "realnode" / "kmod-build"


@pytest.fixture(scope="session")
def dev_cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.Cluster]:
    capture: Any = request.config.pluginmanager.get_plugin("capturemanager")

    def say(msg: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n{msg}", flush=True)

    c = devcluster.up(CLUSTER_NAME, nodes=2, profile="plain", echo=say, real_node=True)
    try:
        yield c
    finally:
        devcluster.down(CLUSTER_NAME, echo=say)


@pytest.fixture(scope="session")
def kube_api(dev_cluster: devcluster.Cluster) -> Any:
    return devcluster.api_client(dev_cluster)


@pytest.fixture(scope="session")
def kubeconfig(dev_cluster: devcluster.Cluster) -> str:
    return str(dev_cluster.kubeconfig)


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    yield from temporary_namespace(kube_api)


@pytest.fixture
def ns(namespace: str, kube_api: Any, node_registry: Registry) -> str:
    """A namespace pods can be made in, with the node registry's pull secret."""
    api: Any = client.CoreV1Api(kube_api)
    api.create_namespaced_secret(namespace, node_registry.pull_secret(images.PULL_SECRET))
    return namespace


@pytest.fixture(scope="session")
def real_node(dev_cluster: devcluster.Cluster) -> realnode.RealNode:
    node = realnode.load(dev_cluster.dir)
    assert node is not None
    return node


@pytest.fixture(scope="session")
def node_registry(dev_cluster: devcluster.Cluster, real_node: realnode.RealNode) -> Registry:
    return real_node.registry(dev_cluster.pki / "ca.crt")


@pytest.fixture(scope="session")
def kernel_cache(real_node: realnode.RealNode) -> Path:
    return realnode.prepare_kernel(lambda _m: None)


@pytest.fixture(scope="session")
def image_refs(node_registry: Registry, kernel_cache: Path) -> dict[str, str]:
    return images.push_all(node_registry, kernel_cache)


@pytest.fixture(scope="session")
def kernel(kube_api: Any, real_node: realnode.RealNode) -> str:
    """The real node's kernel, as its kubelet reports it."""
    api: Any = client.CoreV1Api(kube_api)
    return str(api.read_node(real_node.name).status.node_info.kernel_version)


@pytest.fixture(scope="session")
def destination(node_registry: Registry) -> Iterator[product_images.Destination]:
    with product_images.login_file(
        node_registry.host, node_registry.username, node_registry.password
    ) as authfile:
        yield product_images.Destination(node_registry.host, node_registry.ca, authfile)


@pytest.fixture(scope="session")
def product(destination: product_images.Destination) -> dict[str, str]:
    """The product's images the operator runs on the node, built here and pushed."""
    return product_images.build_images(["agent", "builder", "signer"], destination)


@pytest.fixture(scope="session")
def build_base(kernel: str, destination: product_images.Destination) -> str:
    """The user's builder base: a compiler and the node kernel's headers."""
    built = product_images.build_image(
        BUILD_BASE / "Dockerfile", ROOT, {"KERNEL_VERSION": kernel}, "kmodkit-test/kmod-build"
    )
    return product_images.push(built, f"{destination.host}/base/kmod-build:{kernel}", destination)


@pytest.fixture(scope="session")
def engine_settings(product: dict[str, str], dev_cluster: devcluster.Cluster) -> dict[str, str]:
    """The operator's settings for modules built, signed and loaded on the real node: the
    product's images, the registry's CA (and its ConfigMap in ``build_ns``), a short
    image recheck."""
    return {
        "KMODKIT_AGENT_IMAGE": product["agent"],
        "KMODKIT_BUILDER_IMAGE": product["builder"],
        "KMODKIT_SIGNER_IMAGE": product["signer"],
        "KMODKIT_REGISTRY_CA": str(dev_cluster.pki / "ca.crt"),
        "KMODKIT_BUILD_REGISTRY_CA_CONFIGMAP": "registry-ca",
        "KMODKIT_IMAGE_RECHECK_SECONDS": "10",
    }


@pytest.fixture
def build_ns(ns: str, kube_api: Any, dev_cluster: devcluster.Cluster) -> str:
    """``ns`` with what an in-cluster build of the test pair needs: the registry's CA
    (ConfigMap ``registry-ca``) and the user's Dockerfile (``testmod-dockerfile``)."""
    api: Any = client.CoreV1Api(kube_api)
    api.create_namespaced_config_map(
        ns,
        {
            "metadata": {"name": "registry-ca"},
            "data": {"ca.crt": (dev_cluster.pki / "ca.crt").read_text()},
        },
    )
    api.create_namespaced_config_map(
        ns,
        {
            "metadata": {"name": "testmod-dockerfile"},
            "data": {"dockerfile": (BUILD_BASE / "module.Dockerfile").read_text()},
        },
    )
    return ns


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        cluster = getattr(item, "funcargs", {}).get("dev_cluster")
        node = realnode.load(cluster.dir) if cluster is not None else None
        if node is not None:
            report.sections.append(("real node logs", node.log_tails(60)))
