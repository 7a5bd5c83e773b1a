"""A Module on the real node, end to end, with the product's own parts only: the operator
(``kmodkit run``), its agent and builder images (built here from Debian's archive,
kmodkit_dev.images) and the node's kubelet and containerd in the VM.

The build Job compiles the kernel tier's test pair (tests/kernel/testmod) against the
headers of the node's kernel from the user's Dockerfile (tests/realnode/kmod-build) and
pushes the unsigned module image with the Module's pull secret; the sign Job (the signer
image, kmodkit-sign) signs both modules with the Module's key and pushes the signed image
under containerImage; the loader pod pulls that, the agent loads the pair in
modulesLoadingOrder with its firmware into the VM's kernel (which does not enforce
signatures: tests/kernel proves enforcement), its readiness probe passes and the operator
labels the node. Nothing here writes a label, a status or an image the product's own pods
write: the test only reads them. The two kwok nodes of the cluster are cordoned for the
test: a sign Job may run on any node of its architecture, and kwok would complete it
without running it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core import labels
from kmodkit_dev import realnode
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.integration.oci_images import Client, layer_files
from tests.integration.signing_support import MAGIC, SIGNER_CN, Keys, make_keys, modinfo, no_key_in
from tests.realnode import images
from tests.realnode.test_node import core, pod, read, wait_phase

pytestmark = pytest.mark.timeout(2400)
GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
SECRET = images.PULL_SECRET
NAME = "testmod"
# A build under software emulation: the builder's and the build base's pulls, a kernel
# module compiled by gcc on one emulated CPU, the push.
BUILD_TIMEOUT = 1500.0
STEP_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def kwok_cordoned(kube_api: Any) -> Iterator[None]:
    api = core(kube_api)
    kwok = [n.metadata.name for n in api.list_node(label_selector="type=kwok").items]
    for name in kwok:
        api.patch_node(name, {"spec": {"unschedulable": True}})
    yield
    for name in kwok:
        api.patch_node(name, {"spec": {"unschedulable": None}})


@pytest.fixture
def operator(
    kubeconfig: str,
    kube_api: Any,
    engine_settings: dict[str, str],
    tmp_path: Path,
) -> Iterator[Operator]:
    install(kube_api)
    with running_operator(kubeconfig, tmp_path / "operator.log", **engine_settings) as op:
        yield op


@pytest.fixture
def module_ns(build_ns: str, kube_api: Any, keys: Keys) -> str:
    """``build_ns`` with the signing key and certificate."""
    for name, key, path in (("signing-key", "key", keys.key), ("signing-cert", "cert", keys.cert)):
        core(kube_api).create_namespaced_secret(
            build_ns, {"metadata": {"name": name}, "stringData": {key: path.read_text()}}
        )
    return build_ns


def module(registry: str, build_base: str, run_base: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": NAME},
        "spec": {
            "selector": {realnode.NODE_LABEL: "true"},
            "imageRepoSecret": {"name": SECRET},
            "moduleLoader": {
                "container": {
                    "modprobe": {
                        "moduleName": "kmodkit_test_dev",
                        "modulesLoadingOrder": ["kmodkit_test_dev", "kmodkit_test_dep"],
                        "firmwarePath": "/firmware",
                    },
                    "devicePaths": ["/dev/kmodkit_test"],
                    "sign": {
                        "keySecret": {"name": "signing-key"},
                        "certSecret": {"name": "signing-cert"},
                        "filesToSign": [
                            "/opt/lib/modules/${KERNEL_FULL_VERSION}/extra/kmodkit_test_*.ko"
                        ],
                    },
                    "kernelMappings": [
                        {
                            "regexp": r"^.+-amd64$",
                            "containerImage": f"{registry}/kmods/kmodkit-test:"
                            "${KERNEL_FULL_VERSION}",
                            "build": {
                                "dockerfileConfigMap": {"name": "testmod-dockerfile"},
                                "buildArgs": [
                                    {"name": "BUILD_BASE", "value": build_base},
                                    {"name": "RUN_BASE", "value": run_base},
                                ],
                            },
                        }
                    ],
                }
            },
        },
    }


def custom(kube_api: Any) -> Any:
    return client.CustomObjectsApi(kube_api)


def node_labels(kube_api: Any, name: str) -> dict[str, str]:
    return dict(core(kube_api).read_node(name).metadata.labels or {})


def failures(kube_api: Any, ns: str) -> list[dict[str, Any]]:
    obj = custom(kube_api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME)
    return list((obj.get("status") or {}).get("nodeFailures") or [])


def module_gone(kube_api: Any, ns: str, name: str = NAME) -> bool:
    try:
        custom(kube_api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except ApiException as err:
        return err.status == 404
    return False


def pods_of(kube_api: Any, ns: str, component: str) -> list[Any]:
    return list(
        core(kube_api)
        .list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/component={component}")
        .items
    )


def loaded_test_modules(kube_api: Any, ns: str, busybox: str) -> str:
    """How many kmodkit_test modules the real node's kernel has loaded, read by a pod."""
    check = pod(
        "check", busybox, "grep -c '^kmodkit_test' /proc/modules > /dev/termination-log || true"
    )
    core(kube_api).create_namespaced_pod(ns, check)
    after = wait_phase(kube_api, ns, "check", "Succeeded", "Failed")
    return str(after.status.container_statuses[0].state.terminated.message.strip())


def termination_messages(kube_api: Any, ns: str) -> list[str]:
    """Each ended container's own account of why (the builder's and the agent's)."""
    return [
        f"{p.metadata.name}/{c.name}: {t.message or t.reason}"
        for p in core(kube_api).list_namespaced_pod(ns).items
        for c in p.status.container_statuses or []
        if (t := c.state.terminated or (c.last_state and c.last_state.terminated))
    ]


def test_a_module_is_built_loaded_gated_held_and_unloaded_on_the_real_node(
    kube_api: Any,
    module_ns: str,
    kwok_cordoned: None,
    operator: Operator,
    keys: Keys,
    tmp_path: Path,
    real_node: realnode.RealNode,
    node_registry: Registry,
    build_base: str,
    image_refs: dict[str, str],
    kernel: str,
) -> None:
    ns = module_ns
    custom(kube_api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        module(node_registry.host, build_base, image_refs[images.BUSYBOX]),
    )
    ready = labels.READY.key(ns, NAME)
    batch = client.BatchV1Api(kube_api)

    # 1. The build Job runs on the real node (the one node of that kernel) and succeeds.
    def build_done() -> Any:
        jobs = batch.list_namespaced_job(ns).items
        failed = [j for j in jobs if j.status.failed]
        assert not failed, f"build failed: {termination_messages(kube_api, ns)}"
        return next((j for j in jobs if j.status.succeeded), None)

    job = wait_until(build_done, "the build Job", timeout=BUILD_TIMEOUT, interval=5)
    (build_pod,) = (
        core(kube_api).list_namespaced_pod(ns, label_selector=f"job-name={job.metadata.name}").items
    )
    assert build_pod.spec.node_name == real_node.name

    # 2. The loader pod pulls the pushed image and the agent loads the pair; its
    # readiness probe passes and the operator labels the node.
    wait_until(
        lambda: ready in node_labels(kube_api, real_node.name),
        f"the ready label {ready}",
        timeout=STEP_TIMEOUT,
        interval=2,
    )
    (loader,) = [p for p in pods_of(kube_api, ns, "module-loader") if p.spec.node_name]
    assert loader.spec.node_name == real_node.name
    assert all(s.ready for s in loader.status.container_statuses)
    assert (
        loader.spec.init_containers[0].image == f"{node_registry.host}/kmods/kmodkit-test:{kernel}"
    )

    # 2b. What it loads is the sign Job's image: both modules signed by our key, the
    # build's unsigned image under its own tag, and no byte of the key in any layer.
    registry = Client(node_registry)
    manifest, _ = registry.manifest("kmods/kmodkit-test", kernel)
    top = layer_files(registry.blob("kmods/kmodkit-test", manifest["layers"][-1]["digest"]))
    signed = {Path(p).name: c for p, (info, c) in top.items() if info.isfile() and c}
    assert sorted(signed) == ["kmodkit_test_dep.ko", "kmodkit_test_dev.ko"]
    for name, content in signed.items():
        assert content.endswith(MAGIC), name
        assert modinfo(tmp_path / name, content, "signer") == SIGNER_CN, name
    for layer in manifest["layers"]:
        no_key_in(registry.blob("kmods/kmodkit-test", layer["digest"]), keys, "a layer")
    registry.manifest("kmods/kmodkit-test", f"{kernel}-unsigned")

    # 3. A pod gated on the label runs there and sees the pair loaded, dep used by dev,
    # and the firmware the agent placed read by the module at init.
    gated = pod(
        "gated",
        image_refs[images.BUSYBOX],
        "{ grep '^kmodkit_test' /proc/modules | cut -d' ' -f1,4 | sort; "
        "cat /sys/module/kmodkit_test_dev/parameters/firmware_size; } > /dev/termination-log",
    )
    gated["spec"]["nodeSelector"] = {ready: ""}
    core(kube_api).create_namespaced_pod(ns, gated)
    done = wait_phase(kube_api, ns, "gated", "Succeeded", "Failed")
    assert done.spec.node_name == real_node.name
    message = done.status.container_statuses[0].state.terminated.message
    assert message.splitlines() == [
        "kmodkit_test_dep kmodkit_test_dev,",
        "kmodkit_test_dev -",
        str(len(images.FIRMWARE)),
    ], message

    # 4. A process holding the device: deleting the Module does not unload; the status
    # and a Warning Event on the node name the holder, and the finalizer keeps the Module.
    holder = pod(
        "holder",
        image_refs[images.BUSYBOX],
        "exec 3</dev/kmodkit_test; echo held > /dev/termination-log; exec sleep 3600",
        restart="Always",
        terminationGracePeriodSeconds=1,
        container={"securityContext": {"privileged": True}},
    )
    core(kube_api).create_namespaced_pod(ns, holder)
    wait_phase(kube_api, ns, "holder", "Running")
    custom(kube_api).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME)
    refused = wait_until(
        lambda: next(
            (f for f in failures(kube_api, ns) if "refusing to unload" in f["message"]), None
        ),
        "the unload refused, in status",
        timeout=STEP_TIMEOUT,
        interval=2,
    )
    assert refused["node"] == real_node.name and refused["reason"] == "UnloadFailed"
    assert "(sleep) on /dev/kmodkit_test" in refused["message"], refused
    told = core(kube_api).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={real_node.name}"
    )
    assert any(
        e.reason == "UnloadFailed" and "(sleep) on /dev/kmodkit_test" in e.message
        for e in told.items
    ), [e.message for e in told.items]
    assert not module_gone(kube_api, ns)
    still_holding = read(kube_api, ns, "holder")
    assert still_holding.status.phase == "Running"

    # 5. With the holder gone the unload goes through; the finalizer goes only then.
    core(kube_api).delete_namespaced_pod("holder", ns)
    wait_until(
        lambda: module_gone(kube_api, ns), "the Module's deletion", timeout=STEP_TIMEOUT, interval=2
    )
    assert ready not in node_labels(kube_api, real_node.name)
    assert loaded_test_modules(kube_api, ns, image_refs[images.BUSYBOX]) == "0"
    no_key_in(operator.log.read_bytes(), keys, "the operator's log")
