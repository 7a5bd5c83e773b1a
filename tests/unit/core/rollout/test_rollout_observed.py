"""Reading nodes and pods into planner views, and writing steps back as merge patches."""

from __future__ import annotations

from kmodkit.core.rollout.apply import patch_body
from kmodkit.core.rollout.keys import RolloutKeys
from kmodkit.core.rollout.observed import node_view_from, pod_view_from
from kmodkit.core.rollout.plan import NodePatch
from kmodkit.core.rollout.states import State

KEYS = RolloutKeys.for_policy("fw.default")


def _node(labels: dict[str, str], annotations: dict[str, str], **spec: object) -> dict:
    return {
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "resourceVersion": "42",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_node_in_flight_is_read_back_with_its_record() -> None:
    node = _node(
        {KEYS.state: "evicting", "gate": "false", "skip": "true"},
        {
            KEYS.since: "1700000000",
            KEYS.cordon: "rollout",
            KEYS.attempt: "2",
            KEYS.target: "v2",
            KEYS.gates: '{"gate":"true","other":null}',
        },
        unschedulable=True,
    )
    view = node_view_from(node, KEYS, ("gate",), skip_label="skip", needs_update=True)
    assert view.state is State.EVICTING and view.skipped and view.unschedulable
    assert view.record.since == 1700000000 and view.record.attempt == 2
    assert view.record.cordon == "rollout" and view.record.gates == {"gate": "true", "other": None}
    assert view.gate_values == {"gate": "false"}
    assert (view.uid, view.resource_version) == ("u1", "42")


def test_mangled_annotations_read_as_absent_rather_than_failing_the_pass() -> None:
    node = _node(
        {KEYS.state: "upgrading"},
        {KEYS.since: "soon", KEYS.attempt: "x", KEYS.gates: "{", KEYS.cordon: "me"},
    )
    view = node_view_from(node, KEYS, (), skip_label=None, needs_update=False)
    assert view.state is None
    assert view.record.since is None and view.record.attempt == 0
    assert view.record.gates is None and view.record.cordon is None


def test_pods_are_classified_as_kubectl_drain_does() -> None:
    def pod(owners: list[dict], meta: dict | None = None, **spec: object) -> dict:
        metadata = {"name": "p", "namespace": "ns", "ownerReferences": owners, **(meta or {})}
        return {"metadata": metadata, "spec": spec, "status": {"phase": "Running"}}

    rs = [{"kind": "ReplicaSet", "controller": True}]
    ds = [{"kind": "DaemonSet", "controller": True}]
    assert not pod_view_from(pod(rs), device_consumer=False).bare
    assert pod_view_from(pod([]), device_consumer=False).bare
    assert pod_view_from(pod([{"kind": "ConfigMap"}]), device_consumer=False).bare
    assert pod_view_from(pod(ds), device_consumer=False).daemonset
    mirror = pod(rs, meta={"annotations": {"kubernetes.io/config.mirror": "x"}})
    assert pod_view_from(mirror, device_consumer=False).mirror
    scratch = pod(rs, volumes=[{"name": "s", "emptyDir": {}}])
    assert pod_view_from(scratch, device_consumer=True).empty_dir
    going = pod(rs, meta={"deletionTimestamp": "2026-01-01T00:00:00Z"})
    assert pod_view_from(going, device_consumer=False).terminating


def test_a_guarded_patch_carries_the_observed_resource_version() -> None:
    body = patch_body(NodePatch(labels={"a": "b"}, unschedulable=True), "42")
    assert body == {
        "metadata": {"labels": {"a": "b"}, "resourceVersion": "42"},
        "spec": {"unschedulable": True},
    }


def test_uncordoning_removes_the_field_and_none_removes_keys() -> None:
    body = patch_body(NodePatch(annotations={"x": None}, unschedulable=False), None)
    assert body == {"metadata": {"annotations": {"x": None}}, "spec": {"unschedulable": None}}
