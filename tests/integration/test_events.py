"""Events as ``kubectl describe`` shows them, posted to the real apiserver."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from kmodkit.core.events import (
    COMBINED,
    CONDITION_REPEAT_SECONDS,
    SIMILAR_LIMIT,
    Correlator,
    Recorder,
)


def _about(namespace: str) -> dict[str, str]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "namespace": namespace,
        "name": f"cm-{uuid.uuid4().hex[:6]}",
        "uid": str(uuid.uuid4()),
    }


def _events(core: Any, namespace: str, about: dict[str, str]) -> list[Any]:
    selector = f"involvedObject.name={about['name']}"
    items = core.list_namespaced_event(namespace, field_selector=selector).items
    return sorted(items, key=lambda e: e.metadata.name)


def test_a_repeated_event_is_one_event_counted_across_restarts(
    kube_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    about = _about(namespace)
    start = datetime.now(UTC).replace(microsecond=0)
    recorder = Recorder(core, Correlator())
    assert recorder.post(about, "ModuleLoaded", "loaded", now=start)
    assert recorder.post(about, "ModuleLoaded", "loaded", now=start + timedelta(seconds=30))
    # A restarted process remembers nothing and finds the Event by its name.
    restarted = Recorder(core, Correlator())
    assert restarted.post(about, "ModuleLoaded", "loaded", now=start + timedelta(seconds=60))
    (ev,) = _events(core, namespace, about)
    assert (ev.count, ev.reason, ev.type) == (3, "ModuleLoaded", "Normal")
    assert ev.first_timestamp == start and ev.last_timestamp == start + timedelta(seconds=60)
    assert ev.involved_object.uid == about["uid"]


def test_a_condition_found_after_a_restart_is_not_counted_again(
    kube_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    about = _about(namespace)
    for _ in range(2):  # two process lives, each seeing the condition on several passes
        recorder = Recorder(core, Correlator())
        for _ in range(3):
            recorder.post(
                about, "UnloadFailed", "held", warning=True, repeat_after=CONDITION_REPEAT_SECONDS
            )
    (ev,) = _events(core, namespace, about)
    assert (ev.count, ev.type) == (1, "Warning")


def test_an_expired_event_is_posted_anew(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    about = _about(namespace)
    recorder = Recorder(core, Correlator())
    recorder.post(about, "ModuleLoaded", "loaded")
    (ev,) = _events(core, namespace, about)
    core.delete_namespaced_event(ev.metadata.name, namespace)  # as its TTL would
    assert recorder.post(about, "ModuleLoaded", "loaded")
    (again,) = _events(core, namespace, about)
    assert again.count == 1 and again.metadata.name == ev.metadata.name


def test_many_similar_events_leave_a_readable_list(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    about = _about(namespace)
    recorder = Recorder(core, Correlator())
    for i in range(SIMILAR_LIMIT + 5):
        recorder.post(about, "RolloutDone", f"rollout p on node n{i}: done")
    events = _events(core, namespace, about)
    combined = [e for e in events if e.message.startswith(COMBINED)]
    assert len(events) == SIMILAR_LIMIT + 1 and len(combined) == 1
    assert combined[0].count == 5 and combined[0].message.endswith(f"n{SIMILAR_LIMIT + 4}: done")


def test_a_refused_event_is_reported_not_raised(kube_api: Any) -> None:
    core = client.CoreV1Api(kube_api)
    gone = {"apiVersion": "v1", "kind": "Pod", "namespace": "no-such-ns", "name": "p"}
    assert Recorder(core, Correlator()).post(gone, "ModuleLoaded", "loaded") is False
