"""The real OCI registry (auth + TLS) and the real helm CLI, working together."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import build
from kmodkit_dev.registry import Registry


def _get(reg: Registry, path: str, auth: tuple[str, str] | None, method: str = "GET") -> int:
    req = urllib.request.Request(f"{reg.url}{path}", method=method)
    if auth:
        req.add_header(
            "Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        )
    req.add_header("Accept", "application/vnd.oci.image.manifest.v1+json")
    ctx = ssl.create_default_context(cafile=str(reg.ca))
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_registry_requires_credentials_over_verified_tls(oci_registry: Registry) -> None:
    assert _get(oci_registry, "/v2/", None) == 401
    assert _get(oci_registry, "/v2/", (oci_registry.username, "wrong")) == 401
    assert _get(oci_registry, "/v2/", (oci_registry.username, oci_registry.password)) == 200
    # Without the test CA the certificate is not trusted: verification is on.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(
            f"{oci_registry.url}/v2/", timeout=5, context=ssl.create_default_context()
        )


def test_helm_pushes_to_registry_and_installs_into_cluster(
    oci_registry: Registry, kubeconfig: str, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    build.ensure(["helm"])
    helm = str(build.binary("helm"))
    env = dict(
        os.environ,
        KUBECONFIG=kubeconfig,
        HELM_CONFIG_HOME=str(tmp_path / "cfg"),
        HELM_CACHE_HOME=str(tmp_path / "cache"),
        HELM_DATA_HOME=str(tmp_path / "data"),
    )
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: smoke\ndata:\n"
        "  release: {{ .Release.Name }}\n"
    )

    def run(*args: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [helm, *args], env=env, input=stdin, capture_output=True, text=True, cwd=tmp_path
        )
        assert out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stderr}"
        return out.stdout

    run("package", str(chart), "--destination", str(tmp_path))
    ca = str(oci_registry.ca)
    run(
        "registry",
        "login",
        oci_registry.host,
        "-u",
        oci_registry.username,
        "--password-stdin",
        "--ca-file",
        ca,
        stdin=oci_registry.password,
    )
    run(
        "push",
        str(tmp_path / "smoke-0.1.0.tgz"),
        f"oci://{oci_registry.host}/charts",
        "--ca-file",
        ca,
    )
    auth = (oci_registry.username, oci_registry.password)
    assert _get(oci_registry, "/v2/charts/smoke/manifests/0.1.0", auth, "HEAD") == 200
    assert _get(oci_registry, "/v2/charts/smoke/manifests/0.1.0", None, "HEAD") == 401

    run(
        "install",
        "smoke",
        f"oci://{oci_registry.host}/charts/smoke",
        "--version",
        "0.1.0",
        "--ca-file",
        ca,
        "--namespace",
        namespace,
        "--wait",
    )
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map("smoke", namespace)
    assert cm.data == {"release": "smoke"}
