"""The build Job against the real apiserver's validation and Pod Security admission.

What docs/security.md says of the build Jobs: every field of the Job is one the
apiserver knows (strict field validation), and its pod needs a namespace at the
``privileged`` Pod Security level: ``baseline`` refuses the added SYS_ADMIN and
the unconfined AppArmor profile. Dry runs only: nothing is scheduled.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core.api import Module
from kmodkit.core.engine.build_plan import BuildSettings, build_job
from kmodkit.core.engine.loader_plan import plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.nodes import NodeView

pytestmark = pytest.mark.cluster

KERNEL = "6.8.0-45-generic"


def _job(namespace: str) -> dict[str, Any]:
    module = Module.model_validate(
        {
            "apiVersion": "kmodkit.io/v1alpha1",
            "kind": "Module",
            "metadata": {"name": "xe", "namespace": namespace},
            "spec": {
                "selector": {},
                "imageRepoSecret": {"name": "registry-login"},
                "moduleLoader": {
                    "container": {
                        "modprobe": {"moduleName": "xe"},
                        "kernelMappings": [
                            {
                                "literal": KERNEL,
                                "containerImage": "registry.example/xe:${KERNEL_FULL_VERSION}",
                                "build": {
                                    "dockerfileConfigMap": {"name": "xe-dockerfile"},
                                    "secrets": [{"name": "build-token"}],
                                },
                            }
                        ],
                    }
                },
            },
        }
    )
    node = NodeView("n1", {}, KERNEL, "amd64", True)
    ((image, resolved),) = plan(
        module, [node], [], {}, LoaderSettings("unused")
    ).needed_images.items()
    settings = BuildSettings(builder_image="ghcr.io/kmodkit/builder:0.1.0")
    return build_job(module, image, resolved, 1, [node.name], settings, "inputs")


def _label(kube_api: Any, namespace: str, level: str) -> None:
    """Set the namespace's Pod Security level."""
    client.CoreV1Api(kube_api).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}}
    )


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    template = job["spec"]["template"]
    return {"metadata": {"name": "build-pod", **template["metadata"]}, "spec": template["spec"]}


def test_the_build_job_is_valid_and_its_pod_is_admitted_at_privileged(
    kube_api: Any, namespace: str
) -> None:
    _label(kube_api, namespace, "privileged")
    job = _job(namespace)
    client.BatchV1Api(kube_api).create_namespaced_job(
        namespace, job, dry_run="All", field_validation="Strict"
    )
    created = client.CoreV1Api(kube_api).create_namespaced_pod(
        namespace, _pod(job), dry_run="All", field_validation="Strict"
    )
    (container,) = created.spec.containers
    assert container.security_context.capabilities.add[-1] == "SYS_ADMIN"
    assert container.security_context.app_armor_profile.type == "Unconfined"
    assert not container.security_context.privileged


def test_baseline_pod_security_refuses_the_build_pod_naming_why(
    kube_api: Any, namespace: str
) -> None:
    _label(kube_api, namespace, "baseline")
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(kube_api).create_namespaced_pod(
            namespace, _pod(_job(namespace)), dry_run="All"
        )
    assert refused.value.status == 403
    body = str(refused.value.body)
    assert "baseline" in body and "SYS_ADMIN" in body and "Unconfined" in body
