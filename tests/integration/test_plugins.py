"""A third-party backend, pip-installed next to kmodkit, served by the real operator.

The example package (tests/plugins/kmodkit-example) and a broken one are
installed with pip; nothing in kmodkit names them. Its CRD comes from
``kmodkit crds``; an AcmeDriver becomes a Module the engine loads on kwok
nodes from a real registry, and a device plugin that runs only where the
driver is ready. The broken backends show in health while the others run;
disabling the example by configuration leaves its objects alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core import labels
from kmodkit.core.contract.backend import CONTRACT_VERSION
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.manifests import apply, wait_established
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import running_operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.plugins.install import pip_install

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "acme.example.com", "v1alpha1", "acmedrivers"
PUSHED, NO_IMAGE = "6.8.0-45-generic", "5.14.0-427.el9.x86_64"
DEVICE_PLUGIN_IMAGE = "registry.invalid/acme/npu-device-plugin:test"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = pip_install(tmp_path_factory.mktemp("plugins"), "kmodkit-example", "kmodkit-broken")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def example_crds(kube_api: Any, plugin_env: dict[str, str]) -> None:
    """Install what ``kmodkit crds --backends example`` prints: the Module's and the example's."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kmodkit"), "crds", "--backends", "example"],
        env={**os.environ, **plugin_env},
        capture_output=True,
        text=True,
        check=True,
    )
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    crds = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert crds == ["modules.kmodkit.io", "acmedrivers.acme.example.com"]
    for doc in sorted(docs, key=lambda d: d["kind"] != "CustomResourceDefinition"):
        apply(kube_api, doc)
    for name in crds:
        wait_established(kube_api, name)


@pytest.fixture(scope="module")
def fleet(dev_cluster: devcluster.Cluster) -> Iterator[tuple[str, list[str], list[str]]]:
    """(tag, nodes whose kernel has an image, nodes whose kernel has none), all ``acme=<tag>``."""
    tag = uuid.uuid4().hex[:6]
    with_image = [f"acme-{tag}-{i}" for i in range(2)]
    without = [f"acme-{tag}-old"]
    devcluster.add_nodes(
        dev_cluster,
        [node_manifest(n, PUSHED, {"acme": tag}) for n in with_image]
        + [node_manifest(n, NO_IMAGE, {"acme": tag}) for n in without],
    )
    yield tag, with_image, without
    core = client.CoreV1Api(devcluster.api_client(dev_cluster))
    for n in with_image + without:
        core.delete_node(n)


@pytest.fixture(scope="module")
def operator_namespace(kube_api: Any, oci_registry: Registry) -> Iterator[str]:
    """The operator's namespace, holding the image pull secret AcmeDrivers name."""
    name = f"acme-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_secret(name, oci_registry.pull_secret("pull"))
    oci_registry.push(f"{oci_registry.host}/acme/npu:{PUSHED}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _operator_env(namespace: str, reg: Registry, plugin_env: dict[str, str]) -> dict[str, str]:
    return {
        **plugin_env,
        "KMODKIT_NAMESPACE": namespace,
        "KMODKIT_REGISTRY_CA": str(reg.ca),
        "KMODKIT_AGENT_IMAGE": "registry.invalid/kmodkit/agent:test",
        "KMODKIT_ACME_DEVICE_PLUGIN_IMAGE": DEVICE_PLUGIN_IMAGE,
    }


def _driver(name: str, tag: str, reg: Registry) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AcmeDriver",
        "metadata": {"name": name},
        "spec": {
            "image": f"{reg.host}/acme/npu:${{KERNEL_FULL_VERSION}}",
            "nodeSelector": {"acme": tag},
            "imagePullSecret": "pull",
        },
    }


def _node_labels(kube_api: Any, node: str) -> dict[str, str]:
    return dict(client.CoreV1Api(kube_api).read_node(node).metadata.labels or {})


def _get(read: Any, *args: Any) -> Any:
    try:
        return read(*args)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


@pytest.mark.usefixtures("example_crds")
def test_pip_installed_backend_is_served_and_broken_ones_are_reported(
    kubeconfig: str,
    kube_api: Any,
    oci_registry: Registry,
    plugin_env: dict[str, str],
    operator_namespace: str,
    fleet: tuple[str, list[str], list[str]],
    tmp_path: Path,
) -> None:
    tag, with_image, without = fleet
    ns = operator_namespace
    objects, apps = client.CustomObjectsApi(kube_api), client.AppsV1Api(kube_api)
    env = _operator_env(ns, oci_registry, plugin_env)
    with running_operator(kubeconfig, tmp_path / "operator.log", **env) as op:
        health = op.health()
        assert health is not None
        backends = health["backends"]
        assert {k: backends[k] for k in ("example", "intel_xe", "tenstorrent")} == {
            "example": "running",
            "intel_xe": "running",
            "tenstorrent": "running",
        }
        assert backends["broken"] == (
            "failed: kmodkit_broken.broken:backend: ModuleNotFoundError: "
            "No module named 'acme_npu_sdk'"
        )
        assert backends["future"].startswith("failed: kmodkit_broken:backend: ValueError: ")
        assert (
            f"written for backend contract v{CONTRACT_VERSION + 1}, "
            f"this kmodkit speaks v{CONTRACT_VERSION}"
        ) in backends["future"]
        assert "backend broken failed to load" in op.logged()

        name = f"npu-{tag}"
        objects.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, _driver(name, tag, oci_registry)
        )
        try:
            ready = labels.READY.key(ns, f"acme-{name}")
            wait_until(
                lambda: all(ready in _node_labels(kube_api, n) for n in with_image),
                "the driver loaded on the nodes whose kernel has an image",
                timeout=60,
            )
            status = wait_until(
                lambda: (
                    (
                        s := objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, name).get(
                            "status", {}
                        )
                    )
                    and s.get("readyNodes") == 2
                    and s.get("devicePluginPods") == 2
                    and s
                ),
                "the AcmeDriver's status to count two ready nodes and plugin pods",
                timeout=60,
            )
            assert status["module"] == f"{ns}/acme-{name}"
            assert all(ready not in _node_labels(kube_api, n) for n in without)
            pods = client.CoreV1Api(kube_api).list_namespaced_pod(
                ns, label_selector=f"app.kubernetes.io/instance=acme-{name}"
            )
            assert sorted(p.spec.node_name for p in pods.items) == sorted(with_image)
            assert {p.spec.containers[0].image for p in pods.items} == {DEVICE_PLUGIN_IMAGE}
            daemonset = apps.read_namespaced_daemon_set(f"acme-{name}-device-plugin", ns)
            assert daemonset.metadata.owner_references[0].kind == "AcmeDriver"
        finally:
            objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        # Deleting the AcmeDriver takes its Module (and so the driver) with it.
        wait_until(
            lambda: (
                _get(
                    objects.get_namespaced_custom_object,
                    "kmodkit.io",
                    "v1alpha1",
                    ns,
                    "modules",
                    f"acme-{name}",
                )
                is None
            ),
            "the Module to be collected with its AcmeDriver",
            timeout=60,
        )


@pytest.mark.usefixtures("example_crds")
def test_a_backend_disabled_by_configuration_leaves_its_objects_alone(
    kubeconfig: str,
    kube_api: Any,
    oci_registry: Registry,
    plugin_env: dict[str, str],
    operator_namespace: str,
    fleet: tuple[str, list[str], list[str]],
    tmp_path: Path,
) -> None:
    tag, with_image, _ = fleet
    ns = operator_namespace
    objects = client.CustomObjectsApi(kube_api)
    env = {
        **_operator_env(ns, oci_registry, plugin_env),
        "KMODKIT_BACKENDS": "intel_xe,tenstorrent",
    }
    with running_operator(kubeconfig, tmp_path / "operator.log", **env) as op:
        health = op.health()
        assert health is not None
        assert health["backends"] == {
            "broken": "disabled",
            "example": "disabled",
            "future": "disabled",
            "intel_xe": "running",
            "tenstorrent": "running",
        }
        name = f"off-{tag}"
        objects.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, _driver(name, tag, oci_registry)
        )
        # The engine still works: a Module created directly gets loaded. By the
        # time it is, the example would long have planned the AcmeDriver.
        module = {
            "apiVersion": "kmodkit.io/v1alpha1",
            "kind": "Module",
            "metadata": {"name": "direct", "namespace": ns},
            "spec": {
                "selector": {"acme": tag},
                "imageRepoSecret": {"name": "pull"},
                "moduleLoader": {
                    "container": {
                        "modprobe": {"moduleName": "acme_npu"},
                        "kernelMappings": [
                            {
                                "literal": PUSHED,
                                "containerImage": f"{oci_registry.host}/acme/npu:{PUSHED}",
                            }
                        ],
                    }
                },
            },
        }
        objects.create_namespaced_custom_object("kmodkit.io", "v1alpha1", ns, "modules", module)
        ready = labels.READY.key(ns, "direct")
        wait_until(
            lambda: all(ready in _node_labels(kube_api, n) for n in with_image),
            "the engine to load a Module while the example backend is disabled",
            timeout=60,
        )
        driver = objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        assert "status" not in driver
        assert not driver["metadata"].get("finalizers")  # no handler took it on
        assert (
            _get(
                objects.get_namespaced_custom_object,
                "kmodkit.io",
                "v1alpha1",
                ns,
                "modules",
                f"acme-{name}",
            )
            is None
        )
        objects.delete_namespaced_custom_object("kmodkit.io", "v1alpha1", ns, "modules", "direct")
        objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
