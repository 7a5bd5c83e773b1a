"""Signed modules end to end: ``kmodkit run`` plans builds and sign Jobs, the real signer signs.

A real control plane with kwok nodes on the kernel our test modules are built for, and the
devcluster's registry (TLS, htpasswd). One Module signs a pushed unsigned image; another
builds it first. kwok runs no containers, so two stand-ins play what a node would run:

- the builder stand-in plays kmodkit-build, the buildah builder: when a build Job appears
  it pushes an image of our real unsigned test modules to the Job's ``--destination``
  (tests/realnode/test_builder.py runs the real builder);
- the kubelet stand-in runs a sign Job's container: it reads the Job's pod template, writes
  the Secrets its volumes name into files, and runs the real ``kmodkit-sign`` with the
  Job's own arguments (mount paths mapped onto those files). Nothing else is played.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from kmodkit_dev import cluster as devcluster
from kmodkit_dev.nodes import node_manifest
from kmodkit_dev.operator import Operator, running_operator
from kmodkit_dev.registry import Registry
from kmodkit_dev.waiting import wait_until
from tests.integration.crds_util import install
from tests.integration.oci_images import Client, layer_files
from tests.integration.signing_support import (
    MAGIC,
    SIGNER_CN,
    Kernel,
    Keys,
    make_keys,
    modinfo,
    no_key_in,
    prepare_kernel,
    unsigned_layers,
)

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
STEP = "kmodkit.io/image-step"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    return prepare_kernel()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def operator(
    kubeconfig: str, kube_api: Any, oci_registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    install(kube_api)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(
        kubeconfig,
        log,
        KMODKIT_REGISTRY_CA=str(oci_registry.ca),
        KMODKIT_AGENT_IMAGE="registry.invalid/kmodkit/agent:test",
        KMODKIT_SIGNER_IMAGE="registry.invalid/kmodkit/signer:test",
    ) as op:
        yield op


class Node:
    """Plays what the node would run for build and sign Jobs (see the module docstring)."""

    def __init__(
        self, kube_api: Any, namespace: str, reg: Registry, kernel: Kernel, scratch: Path
    ) -> None:
        self.kube_api, self.namespace, self.reg, self.kernel = kube_api, namespace, reg, kernel
        self.scratch = scratch
        self.seen: list[tuple[str, str]] = []  # (step, image) in the order the Jobs appeared
        self.outputs: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        batch = client.BatchV1Api(self.kube_api)
        for ev in watch.Watch().stream(
            batch.list_namespaced_job, self.namespace, timeout_seconds=300
        ):
            if self._stop.is_set():
                break
            if ev["type"] != "ADDED":
                continue
            job = ev["raw_object"]
            image = job["metadata"]["annotations"]["kmodkit.io/image"]
            step = job["metadata"]["annotations"].get(STEP, "build")
            self.seen.append((step, image))
            try:
                if step == "build":
                    (container,) = job["spec"]["template"]["spec"]["containers"]
                    (image,) = [
                        a.split("=", 1)[1]
                        for a in container["args"]
                        if a.startswith("--destination=")
                    ]
                    ref = image.removeprefix(f"{self.reg.host}/")
                    repository, tag = ref.rsplit(":", 1)
                    Client(self.reg).push_image(repository, tag, unsigned_layers(self.kernel))
                else:
                    self._sign(job)
            except Exception as err:  # reported by the test, not lost with the thread
                self.failures.append(f"{step} {image}: {err!r}")

    def _sign(self, job: dict[str, Any]) -> None:
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        where = self.scratch / job["metadata"]["name"]
        paths: dict[str, Path] = {}
        volumes = {v["name"]: v for v in pod["volumes"]}
        core = client.CoreV1Api(self.kube_api)
        for mount in container["volumeMounts"]:
            source = volumes[mount["name"]]
            target = where / mount["name"]
            target.mkdir(parents=True)
            paths[mount["mountPath"]] = target
            if "secret" in source:
                secret = core.read_namespaced_secret(source["secret"]["secretName"], self.namespace)
                for item in source["secret"]["items"]:
                    (target / item["path"]).write_bytes(base64.b64decode(secret.data[item["key"]]))
        args = [_mapped(arg, paths) for arg in container["args"]]
        env = {**os.environ, "KMODKIT_REGISTRY_CA": str(self.reg.ca)}
        env["KMODKIT_TERMINATION_LOG"] = str(where / "termination-log")
        done = subprocess.run(
            [sys.executable, "-m", "kmodkit.core.signer.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
            check=False,
        )
        self.outputs.append(done.stdout + done.stderr)
        if done.returncode != 0:
            self.failures.append(done.stdout[-2000:] + done.stderr[-2000:])

    def stop(self) -> None:
        self._stop.set()


def _mapped(arg: str, paths: dict[str, Path]) -> str:
    for mount, path in paths.items():
        if arg.startswith(mount + "/"):
            return str(path) + arg[len(mount) :]
    return arg


def _module(name: str, tag: str, reg: Registry, kernel: Kernel, **sign: Any) -> dict[str, Any]:
    mapping: dict[str, Any] = {
        "literal": kernel.version,
        "containerImage": f"{reg.host}/signed/{name}:${{KERNEL_FULL_VERSION}}",
    }
    if "unsignedImage" not in sign:
        mapping["build"] = {"dockerfileConfigMap": {"name": "build"}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": name},
        "spec": {
            "selector": {"signing-test": tag, "module": name},
            "imageRepoSecret": {"name": "pull"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmodkit_test_dev"},
                    "kernelMappings": [mapping],
                    "sign": {
                        "keySecret": {"name": "signing-key"},
                        "certSecret": {"name": "signing-cert"},
                        "filesToSign": [
                            "/opt/lib/modules/${KERNEL_FULL_VERSION}/extra/kmodkit_test_*.ko"
                        ],
                        **sign,
                    },
                }
            },
        },
    }


def _secrets(core: client.CoreV1Api, namespace: str, reg: Registry, keys: Keys) -> None:
    core.create_namespaced_secret(namespace, reg.pull_secret("pull"))
    for name, key, path in (("signing-key", "key", keys.key), ("signing-cert", "cert", keys.cert)):
        core.create_namespaced_secret(
            namespace,
            {
                "metadata": {"name": name},
                "data": {key: base64.b64encode(path.read_bytes()).decode()},
            },
        )


def test_signed_images_are_made_then_loaded_and_no_key_leaves_the_secret(
    operator: Operator,
    kube_api: Any,
    namespace: str,
    oci_registry: Registry,
    dev_cluster: devcluster.Cluster,
    kernel: Kernel,
    keys: Keys,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    nodes = {m: f"sig-{tag}-{m}" for m in ("pre", "built")}
    devcluster.add_nodes(
        dev_cluster,
        [
            node_manifest(n, kernel.version, {"signing-test": tag, "module": m})
            for m, n in nodes.items()
        ],
    )
    core = client.CoreV1Api(kube_api)
    _secrets(core, namespace, oci_registry, keys)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "build"}, "data": {"dockerfile": "FROM scratch\n"}}
    )
    unsigned = f"{oci_registry.host}/unsigned/pre:{kernel.version}"
    Client(oci_registry).push_image("unsigned/pre", kernel.version, unsigned_layers(kernel))
    node = Node(kube_api, namespace, oci_registry, kernel, tmp_path / "node")
    objs = client.CustomObjectsApi(kube_api)
    try:
        for name, sign in (("pre", {"unsignedImage": unsigned}), ("built", {})):
            objs.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _module(name, tag, oci_registry, kernel, **sign)
            )
        for name, node_name in nodes.items():
            ready = f"kmm.node.kubernetes.io/{namespace}.{name}.ready"
            wait_until(
                lambda n=node_name, r=ready: (
                    node.failures or r in core.read_node(n).metadata.labels
                ),
                f"the {name} Module ready on {node_name}",
                timeout=180,
            )
            assert not node.failures, node.failures
        # Read before the nodes go: with no node needing the images their Jobs are deleted.
        jobs = client.BatchV1Api(kube_api).list_namespaced_job(namespace).items
    finally:
        node.stop()
        for n in nodes.values():
            core.delete_node(n)

    signed = {m: f"{oci_registry.host}/signed/{m}:{kernel.version}" for m in nodes}
    built_unsigned = f"{oci_registry.host}/signed/built:{kernel.version}-unsigned"
    # The build pushed the unsigned modules under their own tag, the sign Job made the
    # image the nodes load; nothing but the sign Job ever pushed that name.
    assert sorted(node.seen) == sorted(
        [("sign", signed["pre"]), ("build", built_unsigned), ("sign", signed["built"])]
    )
    assert node.seen.index(("build", built_unsigned)) < node.seen.index(("sign", signed["built"]))

    loaders = "app.kubernetes.io/component=module-loader"
    pods = core.list_namespaced_pod(namespace, label_selector=loaders)
    loaded = {p.spec.node_name: p.spec.init_containers[0].image for p in pods.items}
    assert loaded == {nodes[m]: signed[m] for m in nodes}

    registry = Client(oci_registry)
    for name, image in signed.items():
        manifest, _ = registry.manifest(f"signed/{name}", kernel.version)
        top = layer_files(registry.blob(f"signed/{name}", manifest["layers"][-1]["digest"]))
        modules = {p: c for p, (info, c) in top.items() if info.isfile()}
        names = sorted(Path(p).name for p in modules)
        assert names == ["kmodkit_test_dep.ko", "kmodkit_test_dev.ko"]
        for path, content in modules.items():
            assert content is not None and content.endswith(MAGIC), path
            assert modinfo(tmp_path / "m.ko", content, "signer") == SIGNER_CN, (image, path)
        for layer in manifest["layers"]:
            no_key_in(registry.blob(f"signed/{name}", layer["digest"]), keys, f"a layer of {image}")

    # The key stays in its Secret: not in the Jobs, the Modules, the Events or any log.
    sign_jobs = [j for j in jobs if (j.metadata.annotations or {}).get(STEP) == "sign"]
    assert len(sign_jobs) == 2
    for job in sign_jobs:
        pod = job.spec.template.spec
        assert pod.automount_service_account_token is False
        assert pod.security_context.run_as_non_root is True
        context = pod.containers[0].security_context
        assert context.allow_privilege_escalation is False and not context.privileged
        assert context.capabilities.drop == ["ALL"]
        assert all(m.read_only for m in pod.containers[0].volume_mounts if m.name != "scratch")
    events = core.list_namespaced_event(namespace).items
    assert sum(e.reason == "SignCreated" for e in events) == 2, [e.reason for e in events]
    seen = json.dumps(
        [
            kube_api.sanitize_for_serialization(jobs),
            objs.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL),
            kube_api.sanitize_for_serialization(events),
        ]
    ).encode()
    no_key_in(seen, keys, "the Jobs, Modules or Events")
    no_key_in("".join(node.outputs).encode(), keys, "the signer's output")
    no_key_in(operator.log.read_bytes(), keys, "the operator's log")
