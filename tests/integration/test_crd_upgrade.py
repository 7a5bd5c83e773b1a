"""Upgrading the CRDs of an installed release, the documented way, keeps every object.

Helm installs ``crds/`` once and never upgrades it. The release here is installed
from a copy of the chart whose Module CRD lacks a field the current one has (the
previous chart, in effect), a Module is created, and the new chart's CRDs are applied as
docs/install.md says: ``kubectl apply --server-side --force-conflicts -f charts/kmodkit/crds/``.
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
from tests.integration.test_chart import CHART, Helm

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


def _module(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Module",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"crd-upgrade-test": "none"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "kernelMappings": [{"regexp": ".*", "containerImage": "r.io/xe:1"}],
                }
            },
            **spec,
        },
    }


def _delete_crd(kube_api: Any) -> None:
    extensions = client.ApiextensionsV1Api(kube_api)
    try:
        extensions.delete_custom_resource_definition(CRD)
    except ApiException as err:
        if err.status != 404:
            raise

    def gone() -> bool:
        try:
            extensions.read_custom_resource_definition(CRD)
        except ApiException as err:
            return err.status == 404
        return False

    wait_until(gone, f"{CRD} to be deleted", timeout=60)


def test_new_crds_applied_the_documented_way_keep_every_module(
    kubeconfig: str, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    helm = Helm(tmp_path, kubeconfig, tool="helm4")
    name = f"up-{uuid.uuid4().hex[:6]}"
    common = ["-n", namespace, "--set", f"namespace.name={name}-system", "--take-ownership"]
    # Helm installs crds/ only where a CRD is absent: start from none.
    _delete_crd(kube_api)
    helm.run("install", name, str(_previous_chart(tmp_path)), *common)
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

        applied = subprocess.run(
            [
                str(build.binary("kubectl")),
                f"--kubeconfig={kubeconfig}",
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                str(CHART / "crds"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr

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
