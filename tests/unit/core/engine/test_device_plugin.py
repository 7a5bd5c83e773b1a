"""KMM's devicePlugin: one DaemonSet per Module, gated on the module's readiness label."""

from __future__ import annotations

from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.device_plugin import (
    KUBELET_DEVICE_PLUGINS,
    SPEC_HASH,
    DaemonSetView,
    daemon_set,
    plan_device_plugin,
    plugin_labels,
)
from kmodkit.core.engine.loader_plan import plan
from kmodkit.core.engine.module_rules import validate_module
from tests.unit.core.engine import test_loader_plan as loader
from tests.unit.examples import minimal

PLUGIN = {
    "container": {
        "image": "registry.example.com/xe-device-plugin:1",
        "args": ["-v", "2"],
        "env": [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "MODE", "value": "shared"},
        ],
        "volumeMounts": [{"name": "dev", "mountPath": "/dev"}],
    },
    "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
}


def _with_plugin(**plugin: Any) -> dict[str, Any]:
    body = minimal()
    body["metadata"]["namespace"] = loader.NS
    body["metadata"]["name"] = loader.NAME
    body["spec"]["selector"] = {"gpu": "intel"}
    body["spec"]["devicePlugin"] = {**PLUGIN, **plugin}
    return body


def test_the_plugin_runs_only_where_the_module_is_ready() -> None:
    ds = daemon_set(Module.model_validate(_with_plugin()))
    assert ds is not None
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "intel", loader.READY: ""}
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/xe-device-plugin:1"
    assert container["env"][0]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert mounts == [KUBELET_DEVICE_PLUGINS, "/dev"]
    assert {v["name"] for v in pod["volumes"]} == {"kubelet-device-plugins", "dev"}
    assert "privileged" not in str(container)


def test_without_a_module_loader_the_plugin_runs_on_every_selected_node() -> None:
    body = _with_plugin()
    del body["spec"]["moduleLoader"]
    m = Module.model_validate(body)
    assert validate_module(body) == []
    ds = daemon_set(m)
    assert ds is not None and ds["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "intel"}
    # Loader pods a moduleLoader left behind are unloaded, as for a retired node.
    n = loader.node("a")
    old = loader.running(loader.module(), n)
    p = plan(m, [n], [old], {}, loader.SETTINGS, {"a": []})
    assert p.delete == [old.name]
    assert [c["metadata"]["labels"]["app.kubernetes.io/component"] for c in p.create] == [
        "module-unloader"
    ]


def test_the_daemon_set_is_applied_when_missing_or_changed_and_deleted_when_dropped() -> None:
    m = Module.model_validate(_with_plugin())
    nodes = [loader.node("a"), loader.node("b"), loader.node("x", gpu="amd")]
    ds = daemon_set(m)
    assert ds is not None
    name, digest = ds["metadata"]["name"], ds["metadata"]["annotations"][SPEC_HASH]

    missing = plan_device_plugin(m, nodes, [])
    assert missing.apply == ds
    same = plan_device_plugin(m, nodes, [DaemonSetView(name, digest, 2, 1)])
    assert same.apply is None and same.delete == ()
    assert same.status == {
        "nodesMatchingSelectorNumber": 2,
        "desiredNumber": 2,
        "availableNumber": 1,
    }
    changed = Module.model_validate(_with_plugin(container={"image": "r.io/dp:2"}))
    assert plan_device_plugin(changed, nodes, [DaemonSetView(name, digest, 2, 2)]).apply
    dropped = Module.model_validate(minimal())
    gone = plan_device_plugin(dropped, nodes, [DaemonSetView(name, digest, 2, 2)])
    assert (gone.apply, gone.delete, gone.status) == (None, (name,), None)


def test_device_plugin_volumes_are_checked_as_kmm_does() -> None:
    escapes = _with_plugin(volumes=[{"name": "etc", "hostPath": {"path": "/dev/../etc"}}])
    outside = _with_plugin(volumes=[{"name": "etc", "hostPath": {"path": "/etc"}}])
    two = _with_plugin(volumes=[{"name": "v", "hostPath": {"path": "/dev"}, "emptyDir": {}}])
    ok = _with_plugin(volumes=[{"name": "n", "hostPath": {"path": "/sys//class//net"}}])
    assert [p.path for p in validate_module(escapes)] == [
        "spec.devicePlugin.volumes[0].hostPath.path"
    ]
    assert [p.path for p in validate_module(outside)] == [
        "spec.devicePlugin.volumes[0].hostPath.path"
    ]
    assert [p.path for p in validate_module(two)] == ["spec.devicePlugin.volumes[0]"]
    assert validate_module(ok) == []


def test_a_module_with_neither_a_loader_nor_a_plugin_is_refused() -> None:
    body = minimal()
    del body["spec"]["moduleLoader"]
    assert [p.path for p in validate_module(body)] == ["spec"]


def test_the_device_plugin_ready_label_follows_the_ready_plugin_pods() -> None:
    key = f"kmm.node.kubernetes.io/{loader.NS}.{loader.NAME}.device-plugin-ready"
    fresh, stale, settled = loader.node("a"), loader.node("b", **{key: ""}), loader.node("c")
    labelled = loader.node("d", **{key: ""})
    changes = plugin_labels(loader.NS, loader.NAME, [fresh, stale, settled, labelled], ["a", "d"])
    assert changes == {"a": {key: ""}, "b": {key: None}}
