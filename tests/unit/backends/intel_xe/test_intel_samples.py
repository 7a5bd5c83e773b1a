"""The Ubuntu 26.04 samples: the build ConfigMap is the Dockerfile, and the policy uses it."""

from __future__ import annotations

import yaml

from kmodkit.backends.intel_xe.plan import plan
from kmodkit.core.contract.backend import ClusterView
from kmodkit_dev import xe_build_configmap as build_configmap

SAMPLES = build_configmap.ROOT / "docs" / "samples"


def test_build_configmap_is_generated_from_the_dockerfile() -> None:
    dockerfile = build_configmap.DOCKERFILE.read_text(encoding="utf-8")
    on_disk = build_configmap.SAMPLE.read_text(encoding="utf-8")
    assert on_disk == build_configmap.render(dockerfile), (
        "run `python -m kmodkit_dev.xe_build_configmap` to regenerate the sample"
    )
    assert yaml.safe_load(on_disk)["data"]["dockerfile"] == dockerfile


def test_dockerfile_installs_modules_and_firmware_where_the_loader_looks() -> None:
    dockerfile = build_configmap.DOCKERFILE.read_text(encoding="utf-8")
    stages = [line for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert stages == ["FROM ${BASE_IMAGE} AS builder", "FROM ${BASE_IMAGE}"]
    assert "ARG BASE_IMAGE=ubuntu:26.04" in dockerfile
    assert "COPY --from=builder /build/modules-out/ /opt/lib/modules/" in dockerfile
    assert "COPY --from=builder /build/firmware-out/xe/ /firmware/xe/" in dockerfile
    assert 'depmod -b /opt "${KERNEL_FULL_VERSION}"' in dockerfile
    assert "sha256sum -c" in dockerfile


def test_sample_policy_builds_with_the_sample_configmap() -> None:
    policy = yaml.safe_load((SAMPLES / "clusterpolicy-ubuntu26.04.yaml").read_text())
    configmap = yaml.safe_load(build_configmap.SAMPLE.read_text())
    view = ClusterView(
        nodes=[],
        api_groups=frozenset({"resource.k8s.io"}),
        operator_namespace="kmodkit-system",
        watched={"admin-access-namespaces": [{"metadata": {"name": "kmodkit-system"}}]},
    )
    p = plan({**policy, "metadata": {**policy["metadata"], "uid": "u"}}, view)
    (module,) = [o for o in p.objects if o["kind"] == "Module"]
    assert module["metadata"]["namespace"] == configmap["metadata"]["namespace"]
    container = module["spec"]["moduleLoader"]["container"]
    (mapping,) = container["kernelMappings"]
    assert mapping["build"]["dockerfileConfigMap"]["name"] == configmap["metadata"]["name"]
    assert container["modprobe"]["firmwarePath"] == "/firmware"
    build_args = {a["name"] for a in mapping["build"]["buildArgs"]}
    dockerfile = configmap["data"]["dockerfile"]
    assert all(f"ARG {name}" in dockerfile for name in build_args)
    assert p.status["errors"] == []
