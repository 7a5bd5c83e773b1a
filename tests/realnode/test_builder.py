"""kmodkit-build, the build Job's program, run for real: buildah as root on this machine.

The arguments are the ones the engine's build Job passes (``build_job``), with the
paths the pod would mount mapped to directories holding what its volumes would
(``builder_support.Pod``); the one addition is ``--cert-dir`` with the test
registries' CAs, which a cluster's builder image would trust. The registries are
real (CNCF distribution, TLS verified against that CA, htpasswd logins), and the
base image is busybox-static from Debian packed as an OCI image by the tests'
own client. buildah keeps its layers in the test's directory (the pod's
emptyDir), through CONTAINERS_STORAGE_CONF.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kmodkit.core.api import Module
from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit_dev import registry as devregistry
from tests.integration.oci_images import Client, layer_files
from tests.realnode.builder_support import (
    BUILDER,
    KERNEL,
    Pod,
    authfile,
    busybox_layer,
    job_container,
)

BASE = "base/busybox"
SETTINGS = BuildSettings(builder_image="ghcr.io/kmodkit/builder:0.1.0")
SECRET_TEXT = "build-token-" + secrets.token_hex(8)


def module(destination: str, secret: bool = True) -> Module:
    build: dict[str, Any] = {
        "dockerfileConfigMap": {"name": "xe-dockerfile"},
        "buildArgs": [{"name": "REF", "value": "v1 with spaces; $(not run)"}],
    }
    if secret:
        build["secrets"] = [{"name": "build-token"}]
    return Module.model_validate(
        {
            "apiVersion": "kmodkit.io/v1alpha1",
            "kind": "Module",
            "metadata": {"name": "xe", "namespace": "drivers"},
            "spec": {
                "selector": {},
                "imageRepoSecret": {"name": "registry-login"},
                "moduleLoader": {
                    "container": {
                        "modprobe": {"moduleName": "xe"},
                        "kernelMappings": [
                            {
                                "literal": KERNEL,
                                "containerImage": f"{destination}:${{KERNEL_FULL_VERSION}}",
                                "build": build,
                            }
                        ],
                    }
                },
            },
        }
    )


@pytest.fixture(scope="module")
def base_image(oci_registry: devregistry.Registry) -> str:
    Client(oci_registry).push_image(BASE, "1", [busybox_layer()])
    return f"{oci_registry.host}/{BASE}:1"


DOCKERFILE = """\
FROM {base}
ARG KERNEL_FULL_VERSION
ARG REF
# The build secret and the host's modules are where KMM's kaniko pod had them.
RUN test -s /run/secrets/build-token/token \\
    && mkdir -p /opt/lib/modules/$KERNEL_FULL_VERSION \\
    && echo "$REF" > /opt/lib/modules/$KERNEL_FULL_VERSION/ref \\
    && ls /host/lib/modules > /opt/host-modules
LABEL org.kmodkit.test=built
"""


def test_the_job_builds_from_the_dockerfile_and_pushes_with_the_pull_secret(
    oci_registry: devregistry.Registry, base_image: str, tmp_path: Path
) -> None:
    """Built and pushed: the build arg reached the RUN step unchanged (one argv element,
    never evaluated), the secret was readable and is in no layer, the host's modules
    were visible, and the image's config and layers are buildah's from our Dockerfile."""
    destination = f"{oci_registry.host}/built/xe"
    container = job_container(module(destination), KERNEL, SETTINGS)
    login = {oci_registry.host: (oci_registry.username, oci_registry.password)}
    pod = Pod(
        tmp_path,
        DOCKERFILE.format(base=base_image),
        {"build-token": {"token": SECRET_TEXT}},
        authfile(login),
        [oci_registry],
    )
    started = time.monotonic()
    done, message = pod.run(container)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert message == ""
    print(f"build and push took {took:.1f}s")

    client = Client(oci_registry)
    manifest, _ = client.manifest("built/xe", KERNEL)
    config = json.loads(client.blob("built/xe", manifest["config"]["digest"]))
    assert config["architecture"] == "amd64" and config["os"] == "linux"
    assert config["config"]["Labels"]["org.kmodkit.test"] == "built"
    assert config["config"]["Env"] == ["PATH=/usr/bin"]  # the base image's
    assert config["config"]["Labels"]["io.buildah.version"]  # buildah made it
    # The RUN step, with the build arguments it ran with (the injected kernel among them).
    (run,) = [h["created_by"] for h in config["history"] if "test -s" in h.get("created_by", "")]
    assert f"KERNEL_FULL_VERSION={KERNEL}" in run and "/bin/sh -c test -s /run/secrets/" in run
    # The base layer, then the RUN step's.
    assert len(manifest["layers"]) == 2
    files: dict[str, Any] = {}
    for entry in manifest["layers"]:
        data = client.blob("built/xe", entry["digest"])
        assert SECRET_TEXT.encode() not in data
        files.update(layer_files(data))
    assert files[f"opt/lib/modules/{KERNEL}/ref"][1] == b"v1 with spaces; $(not run)\n"
    listed = (files["opt/host-modules"][1] or b"").decode().split()
    assert listed == [KERNEL]  # the node's /lib/modules, as the Pod stands it in
    # The secret's mount point may stay behind, empty; its file does not.
    assert not [path for path in files if path.startswith("run/secrets/build-token/")]


@pytest.fixture
def second_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devregistry.Registry]:
    reg = devregistry.start(
        tmp_path_factory.mktemp("registry-b"), "pusher", secrets.token_urlsafe(16), tls=True
    )
    yield reg
    reg.stop()


def test_a_wrong_push_password_fails_naming_the_step_and_registry_never_the_password(
    oci_registry: devregistry.Registry,
    second_registry: devregistry.Registry,
    base_image: str,
    tmp_path: Path,
) -> None:
    """The base image pulls with the right login; the push, to another registry, has a
    wrong one: the build exits non-zero and its termination message says the push of
    that image to that registry failed, and why, with no password anywhere."""
    destination = f"{second_registry.host}/built/xe"
    wrong = "wrong-" + secrets.token_hex(8)
    login = {
        oci_registry.host: (oci_registry.username, oci_registry.password),
        second_registry.host: (second_registry.username, wrong),
    }
    pod = Pod(
        tmp_path,
        f"FROM {base_image}\nLABEL org.kmodkit.test=pushed\n",
        {},
        authfile(login),
        [oci_registry, second_registry],
    )
    done, message = pod.run(job_container(module(destination, secret=False), KERNEL, SETTINGS))
    assert done.returncode != 0
    assert message.startswith(f"pushing {destination}:{KERNEL} failed (buildah exited ")
    assert second_registry.host in message
    assert "authentication required" in message or "unauthorized" in message
    # Nor the logins as the pull secret holds them (base64 of user:password). Named, not
    # shown, when found: a failing assertion must not print them either.
    held = {f"auth of {host}": json.loads(pod.auth)["auths"][host]["auth"] for host in login}
    logins = {"wrong password": wrong, "base's password": oci_registry.password, **held}
    outputs = {"message": message, "stdout": done.stdout, "stderr": done.stderr}
    leaks = [(o, n) for o, text in outputs.items() for n, value in logins.items() if value in text]
    assert leaks == []


def test_an_unknown_argument_is_refused_without_echoing_its_value(tmp_path: Path) -> None:
    """A mistyped flag stops the builder before buildah runs, and its value (which could be
    a credential) is printed nowhere."""
    message = tmp_path / "termination-log"
    done = subprocess.run(
        [str(BUILDER), "--destination=r.example/x:1", "--pasword=hunter2-value"],
        env={"PATH": os.environ["PATH"], "KMODKIT_TERMINATION_LOG": str(message)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert message.read_text() == "unknown argument --pasword\n"
    assert "hunter2-value" not in done.stdout + done.stderr


def test_a_layer_the_build_may_not_apply_is_explained(tmp_path: Path) -> None:
    """buildah's error when a base layer holds device nodes (a build Job has no MKNOD, so
    applying the layer fails with EPERM) gets a hint saying so. buildah here is a stand-in
    printing the error the real one printed in a build Job on the real node."""
    fake = tmp_path / "bin" / "buildah"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'Error: creating build container: writing blob: adding layer with "
        'blob "sha256:2958": ApplyLayer stdout:  stderr: operation not permitted exit status 1\'\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    message = tmp_path / "termination-log"
    done = subprocess.run(
        [str(BUILDER), "--destination=r.example/x:1", "--dockerfile=/D", "--context=/"],
        env={
            "PATH": f"{fake.parent}:{os.environ['PATH']}",
            "KMODKIT_TERMINATION_LOG": str(message),
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    text = message.read_text()
    assert "ApplyLayer stdout:  stderr: operation not permitted" in text
    assert "most often device nodes under /dev: use a base image without them" in text
