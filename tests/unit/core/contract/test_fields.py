"""The field paths a backend's Watch names, and the object cut down to them."""

from __future__ import annotations

import re

import pytest

from kmodkit.core.contract.backend import Watch
from kmodkit.core.contract.fields import cut, field_tree

POD = {
    "metadata": {"name": "p", "labels": {"a.example.com/x": "1"}, "uid": "u"},
    "spec": {
        "nodeName": "n1",
        "containers": [
            {"name": "c", "image": "i", "env": [{"name": "E", "value": "v"}]},
            {"name": "d", "image": "j"},
        ],
        "volumes": [{"name": "v"}],
    },
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_a_path_keeps_its_field_whole_and_nothing_beside_it() -> None:
    kept = cut(POD, field_tree(["metadata.labels", "spec.nodeName", "status.conditions"]))
    assert kept == {
        "metadata": {"labels": {"a.example.com/x": "1"}},
        "spec": {"nodeName": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_list_segment_keeps_the_rest_of_the_path_in_each_element() -> None:
    kept = cut(POD, field_tree(["spec.containers[].name", "spec.containers[].env"]))
    assert kept == {
        "spec": {"containers": [{"name": "c", "env": [{"name": "E", "value": "v"}]}, {"name": "d"}]}
    }


def test_absent_fields_stay_absent_and_another_shape_is_kept_as_it_is() -> None:
    tree = field_tree(["status.hostIP", "status.phase.x", "spec.volumes.name", "spec.nodeName[]"])
    assert cut(POD, tree) == {
        "status": {"phase": "Running"},
        "spec": {"volumes": [{"name": "v"}], "nodeName": "n1"},
    }


@pytest.mark.parametrize(
    "paths",
    [
        ["metadata", "metadata.name"],
        ["metadata.name", "metadata"],
    ],
)
def test_a_field_kept_whole_wins_over_a_deeper_path(paths: list[str]) -> None:
    assert cut(POD, field_tree(paths)) == {"metadata": POD["metadata"]}


def test_a_selection_keeps_only_the_elements_whose_key_has_that_value() -> None:
    tree = field_tree(["spec.containers[name=c].env", "status.conditions[type=Ready]"])
    assert cut(POD, tree) == {
        "spec": {"containers": [{"env": [{"name": "E", "value": "v"}]}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert cut(POD, field_tree(["spec.containers[name=x]"])) == {"spec": {"containers": []}}


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("", "segment '' is not a name"),
        ("spec..nodeName", "segment '' is not a name"),
        ("spec.", "segment '' is not a name"),
        ("[].name", "segment '[]' is not a name"),
        ("spec.containers[name]", "segment 'containers[name]' is not a name"),
        ("spec.containers[=c]", "segment 'containers[=c]' is not a name"),
        ("spec.containers[name=c].env", "containers is named another way too"),
    ],
)
def test_a_path_it_cannot_follow_is_refused_when_the_watch_is_declared(
    path: str, says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"field path {path!r}: {says}")):
        Watch(
            name="pods",
            group="",
            version="v1",
            plural="pods",
            fields=("spec.nodeName", "spec.containers[].name", path),
        )


def test_a_watch_naming_no_fields_keeps_the_object() -> None:
    watch = Watch(name="pods", group="", version="v1", plural="pods")
    assert watch.kept(POD) is POD
