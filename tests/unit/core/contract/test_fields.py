"""The field paths a backend's Watch names, and the object cut down to them."""

from __future__ import annotations

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


@pytest.mark.parametrize("path", ["", "spec..nodeName", "spec.", "[].name"])
def test_an_empty_segment_is_refused_when_the_watch_is_declared(path: str) -> None:
    with pytest.raises(ValueError, match="empty segment"):
        Watch(name="pods", group="", version="v1", plural="pods", fields=("spec.nodeName", path))


def test_a_watch_naming_no_fields_keeps_the_object() -> None:
    watch = Watch(name="pods", group="", version="v1", plural="pods")
    assert watch.kept(POD) is POD
