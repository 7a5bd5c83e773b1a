"""Which scopes a Bearer challenge asks for that the signer's token does not hold."""

from __future__ import annotations

from kmodkit.core.signer.oci import uncovered_scopes

PUSH = "repository:target/repo:pull,push"


def test_actions_are_a_set_in_any_order() -> None:
    assert uncovered_scopes(["repository:target/repo:push,pull"], [PUSH]) == []


def test_a_mount_source_not_held_is_asked_for() -> None:
    asked = ["repository:target/repo:push,pull", "repository:source/repo:pull"]
    assert uncovered_scopes(asked, [PUSH]) == ["repository:source/repo:pull"]


def test_an_action_not_held_is_asked_for_even_if_others_are() -> None:
    assert uncovered_scopes([PUSH], ["repository:target/repo:pull"]) == [PUSH]


def test_actions_of_one_resource_may_come_from_several_scopes() -> None:
    held = ["repository:target/repo:pull", "repository:target/repo:push"]
    assert uncovered_scopes([PUSH], held) == []
    assert uncovered_scopes(["repository:other/repo:pull"], held) == ["repository:other/repo:pull"]
