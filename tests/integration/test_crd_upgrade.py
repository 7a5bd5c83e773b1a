"""Upgrading the CRDs of an installed release, the documented way, keeps every object.

Helm installs ``crds/`` once and never upgrades it. The cluster starts with
the Module CRD of a chart that lacked a field the current one has (the previous chart,
in effect; it replaces the live CRD rather than deleting it, which Modules with
finalizers from other tests would hold up), the release is installed from that chart,
a Module is created, and the new chart's CRDs are applied as docs/install.md says:
``kubectl apply --server-side --force-conflicts --field-manager=helm -f charts/kmodkit/crds/``.
The Module must come through unchanged, the new field must be accepted, and a
``helm upgrade`` to the current chart must go through.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit_dev import build
from kmodkit_dev.waiting import wait_until
from tests.integration.helm import CHART, Helm
from tests.unit.examples import minimal

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "kmodkit.io", "v1alpha1", "modules"
CRD = "modules.kmodkit.io"
NEW_FIELD = "devicePlugin"


def _previous_chart(tmp: Path) -> Path:
    """The chart as it was before ``spec.devicePlugin`` joined the Module CRD."""
    chart = tmp / "kmodkit"
    shutil.copytree(CHART, chart)
    path = chart / "crds" / "kmodkit.io_modules.yaml"
    crd = yaml.safe_load(path.read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec["properties"][NEW_FIELD]
    spec["x-kubernetes-validations"] = [
        rule for rule in spec.get("x-kubernetes-validations", []) if NEW_FIELD not in rule["rule"]
    ]
    path.write_text(yaml.safe_dump(crd))
    return chart


def _kubectl_apply(kubeconfig: str, path: Path) -> None:
    """The documented way to apply a chart's CRDs."""
    applied = subprocess.run(
        [
            str(build.binary("kubectl")),
            f"--kubeconfig={kubeconfig}",
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=helm",
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr


def _served(kube_api: Any, field: str) -> bool:
    """Whether the live Module CRD's spec has ``field``."""
    crd = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(CRD)
    spec = crd.spec.versions[0].schema.open_apiv3_schema.properties["spec"]
    return field in (spec.properties or {})


def _module(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = minimal()
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"] |= {"selector": {"crd-upgrade-test": "none"}, **spec}
    return body


def test_new_crds_applied_the_documented_way_keep_every_module(
    kubeconfig: str, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    helm = Helm(tmp_path, kubeconfig, tool="helm4")
    name = f"up-{uuid.uuid4().hex[:6]}"
    # The admission policies may have been applied by other tests, under their own manager.
    common = [
        "-n", namespace, "--set", f"namespace.name={name}-system",
        "--take-ownership", "--force-conflicts",
    ]  # fmt: skip
    previous = _previous_chart(tmp_path)
    _kubectl_apply(kubeconfig, previous / "crds" / "kmodkit.io_modules.yaml")
    wait_until(lambda: not _served(kube_api, NEW_FIELD), "the previous Module schema")
    helm.run("install", name, str(previous), *common)
    objects = client.CustomObjectsApi(kube_api)
    try:
        kept = objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _module(namespace, "kept")
        )
        plugin = {"container": {"image": "r.io/plugin:1"}}
        with pytest.raises(ApiException) as refused:  # the previous schema does not know it
            objects.create_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                _module(namespace, "new", devicePlugin=plugin),
                field_validation="Strict",
            )
        assert refused.value.status in (400, 422)

        _kubectl_apply(kubeconfig, CHART / "crds")

        after = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kept")
        assert after["metadata"]["uid"] == kept["metadata"]["uid"]
        assert after["spec"] == kept["spec"]
        new = copy.deepcopy(_module(namespace, "new", devicePlugin=plugin))
        created = wait_until(
            lambda: _created(objects, namespace, new), "the new field to be served", timeout=30
        )
        assert created["spec"][NEW_FIELD]["container"]["image"] == "r.io/plugin:1"
        helm.run("upgrade", name, str(CHART), *common)
    finally:
        helm.run("uninstall", name, "-n", namespace, "--wait", ok=False)
        _kubectl_apply(kubeconfig, CHART / "crds")  # the current schema, for every later test


def _created(objects: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return dict(
            objects.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
            )
        )
    except ApiException as err:
        if err.status in (400, 422):
            return None
        raise
