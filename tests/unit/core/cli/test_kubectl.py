"""``kubectl kmodkit``'s pure parts: status rows and frames, and what each verb changes."""

from __future__ import annotations

import re
from typing import Any

import click
import pytest
from rich.console import Console

from kmodkit.core.cli.kubectl import rows, verbs, views
from kmodkit.core.cli.kubectl.kinds import Kind, kinds_named, pick, split_ref
from kmodkit.core.contract.backend import RolloutControls
from kmodkit.core.schema.crd import MODULE_CRD, CrdSource

POLICY_CRD = CrdSource(
    group="example.com",
    version="v1",
    kind="DriverPolicy",
    plural="driverpolicies",
    spec_model=MODULE_CRD.spec_model,
    status_model=MODULE_CRD.status_model,
    description="",
    short_names=("dp",),
    namespaced=False,
)
POLICY = Kind(
    POLICY_CRD,
    "example",
    RolloutControls(policy_id=lambda n: f"dp.{n}", pause_field="paused", skip_label="x.io/skip"),
)
MODULE = Kind(MODULE_CRD, "kmodkit")
STATE = "rollout.kmodkit.io/dp.a"


def _text(renderable: Any, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _policy(spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "a"}, "spec": {"version": "2.0", **(spec or {})}, "status": status}


def _node(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": "42", "labels": labels or {}}}


# -- status ---------------------------------------------------------------------


def test_a_rolling_policy_row_shows_progress_states_and_what_blocks() -> None:
    obj = _policy(
        summary={"matched": 4, "upToDate": 1, "inProgress": 1, "pending": 2, "failed": 0},
        nodes=[
            {"name": "n2", "state": "Draining", "reason": "Draining"},
            {"name": "n3", "state": "Pending", "reason": "WaitingForSlot"},
            {"name": "n4", "state": "Pending", "reason": "WaitingForSlot"},
            {"name": "n1", "state": "Done", "reason": "Ready"},
        ],
        nodesOmitted=0,
    )
    r = rows.row(POLICY, obj)
    assert r.progress == (1, 4)
    assert r.nodes == "matched=4 upToDate=1 inProgress=1 pending=2"
    assert r.blocking == "Draining: 1 node; WaitingForSlot: 2 nodes"


def test_a_paused_or_halted_policy_says_so() -> None:
    halted = _policy(
        conditions=[
            {"type": "Progressing", "status": "False", "reason": "Halted", "message": "n2 failed"}
        ],
        nodes=[{"name": "n2", "state": "Failed", "reason": "EvictionBlocked"}],
    )
    assert rows.row(POLICY, halted).blocking == "Halted: n2 failed"
    assert rows.row(POLICY, halted).failures == "n2: EvictionBlocked"
    paused = _policy({"paused": True})
    assert rows.row(POLICY, paused).blocking == "Paused: spec.paused is true"
    idle = _policy(conditions=[{"type": "Progressing", "status": "False", "reason": "Idle"}])
    assert rows.row(POLICY, idle).blocking == ""


def test_progress_of_a_module_and_of_components() -> None:
    module = {
        "moduleLoader": {"nodesMatchingSelectorNumber": 5, "desiredNumber": 4, "availableNumber": 3}
    }
    assert rows.progress(module) == (3, 4)
    # The component furthest behind.
    assert rows.progress({"kmmStatus": "4/4", "devicePluginStatus": "1/4", "draStatus": "N/A"}) == (
        1,
        4,
    )
    assert rows.progress({}) is None


def test_bar() -> None:
    assert views.bar(0, 4, width=8) == "░░░░░░░░ 0/4"
    assert views.bar(1, 4, width=8) == "██░░░░░░ 1/4"
    assert views.bar(3, 4, width=8) == "██████░░ 3/4"
    assert views.bar(19, 20, width=8) == "███████░ 19/20", "full only when every node is"
    assert views.bar(4, 4, width=8) == "████████ 4/4"
    assert views.bar(0, 0, width=8) == "░░░░░░░░ 0/0"


def test_the_live_frame_has_one_header_and_a_bar_per_policy() -> None:
    r = rows.row(POLICY, _policy(summary={"matched": 2, "upToDate": 1}))
    text = _text(views.live([r], ["modules.kmodkit.io"], "https://api:6443", "18:00:00 UTC", 2))
    assert text.count("kmodkit status") == 1
    assert "https://api:6443  18:00:00 UTC  every 2s" in text
    line = next(ln for ln in text.splitlines() if "DriverPolicy" in ln)
    assert views.bar(1, 2) in line and "matched=2 upToDate=1" in line
    assert "not served by this cluster: modules.kmodkit.io" in text


def test_a_narrow_terminal_folds_the_prose_never_what_names_a_row() -> None:
    failing = rows.row(
        POLICY, _policy(summary={"matched": 2}, errors=["the registry refused: " + "x" * 120])
    )
    text = _text(views.table([failing]), width=100)
    line = next(ln for ln in text.splitlines() if "DriverPolicy" in ln)
    assert re.match(r"DriverPolicy +a +example +2\.0 +" + views.bar(0, 2), line), text


# -- naming objects -------------------------------------------------------------


def test_kind_words_and_refs() -> None:
    assert split_ref("dp/a") == ("dp", "a") and split_ref("a") == (None, "a")
    with pytest.raises(click.UsageError, match="neither NAME nor KIND/NAME"):
        split_ref("dp/")
    for word in ("dp", "DriverPolicy", "driverpolicies", "driverpolicies.example.com"):
        assert kinds_named(word, [POLICY, MODULE]) == [POLICY]
    with pytest.raises(
        click.UsageError, match=r"no kind 'ds' here; one of: DriverPolicy \(dp\), Module \(kmod\)"
    ):
        kinds_named("ds", [POLICY, MODULE])


def test_pick_refuses_none_and_ambiguity() -> None:
    a = _policy()
    assert pick("a", [(POLICY, a)]) == (POLICY, a)
    with pytest.raises(click.ClickException, match="no Module or policy named 'a'"):
        pick("a", [])
    with pytest.raises(click.ClickException, match="more than one object; say which: dp/a, kmod/a"):
        pick("a", [(POLICY, a), (MODULE, a)])


# -- verbs ----------------------------------------------------------------------


def test_pause_and_resume() -> None:
    edit = verbs.pause(POLICY, _policy(), True, [POLICY])
    assert edit.body == {"spec": {"paused": True}}
    assert [str(c) for c in edit.changes] == ["dp/a: spec.paused: false -> true"]
    assert verbs.pause(POLICY, _policy({"paused": True}), True, [POLICY]).body is None
    assert verbs.pause(POLICY, _policy({"paused": True}), True, [POLICY]).already == (
        "dp/a is already paused"
    )
    resumed = verbs.pause(POLICY, _policy({"paused": True}), False, [POLICY])
    assert resumed.body == {"spec": {"paused": False}}
    assert verbs.pause(POLICY, _policy(), False, [POLICY]).already == "dp/a is already running"


def test_pause_refuses_a_kind_without_a_pause_switch() -> None:
    module = {"metadata": {"name": "xe", "namespace": "drivers"}}
    with pytest.raises(click.ClickException) as err:
        verbs.pause(MODULE, module, True, [POLICY])
    assert err.value.message == (
        "kmod/drivers/xe: a Module cannot be paused, it has no pause switch "
        "(kinds that have one: DriverPolicy)"
    )


def test_skip_and_unskip_change_only_what_differs() -> None:
    keys = ["a.io/skip", "b.io/skip"]
    edit = verbs.skip(_node({"a.io/skip": "true", "b.io/skip": "false"}), keys, True)
    assert edit.body == {"metadata": {"labels": {"b.io/skip": "true"}}}
    assert [str(c) for c in edit.changes] == ["node/n1: label b.io/skip: false -> true"]
    again = verbs.skip(_node({"a.io/skip": "true", "b.io/skip": "true"}), keys, True)
    assert again.body is None
    assert again.already == "node/n1 is already skipped by a.io/skip, b.io/skip"
    back = verbs.skip(_node({"a.io/skip": "true"}), keys, False)
    assert back.body == {"metadata": {"labels": {"a.io/skip": None}}}
    assert [str(c) for c in back.changes] == ["node/n1: label a.io/skip: true -> (unset)"]
    assert verbs.skip(_node(), keys, False).body is None


def test_retry_clears_only_the_failed_state_label_at_the_read_version() -> None:
    node = _node({STATE: "failed", "rollout.kmodkit.io/fw.b": "failed", "other": "x"})
    node["metadata"]["annotations"] = {f"{STATE}.cordon": "rollout"}
    edit = verbs.retry(node, "dp.a")
    assert edit.body == {"metadata": {"labels": {STATE: None}, "resourceVersion": "42"}}
    assert [str(c) for c in edit.changes] == [f"node/n1: label {STATE}: failed -> (unset)"]
    every = verbs.retry(node, None)
    assert every.body is not None
    assert every.body["metadata"]["labels"] == {STATE: None, "rollout.kmodkit.io/fw.b": None}


def test_retry_refuses_a_node_that_is_not_failed() -> None:
    with pytest.raises(click.ClickException) as err:
        verbs.retry(_node({STATE: "draining"}), "dp.a")
    assert err.value.message == (
        "node/n1 is draining in rollout dp.a, not failed: it is moving; wait until it is done "
        "or failed"
    )
    with pytest.raises(click.ClickException, match=r"is required in rollout dp\.a, not failed"):
        verbs.retry(_node({STATE: "required"}), None)
    with pytest.raises(click.ClickException, match=r"is done in rollout dp\.a, not failed"):
        verbs.retry(_node({STATE: "done", "rollout.kmodkit.io/fw.b": "failed"}), "dp.a")


def test_retry_of_an_idle_node_changes_nothing() -> None:
    assert verbs.retry(_node(), "dp.a").already == "node/n1 is already idle in rollout dp.a"
    assert verbs.retry(_node(), None).already == "node/n1 is already idle in every rollout"
    assert verbs.retry(_node({"rollout.kmodkit.io/fw.b": "failed"}), "dp.a").body is None


def _module(version: str | None) -> dict[str, Any]:
    container = {"version": version} if version else {}
    return {
        "metadata": {"name": "xe", "namespace": "drivers"},
        "spec": {"moduleLoader": {"container": container}},
    }


def test_upgrade_spells_the_kmm_key() -> None:
    key = "kmm.node.kubernetes.io/version-module.drivers.xe"
    edit = verbs.upgrade(_node({key: "v1"}), _module("v2"), "v2")
    assert edit.body == {"metadata": {"labels": {key: "v2"}}}
    assert [str(c) for c in edit.changes] == [f"node/n1: label {key}: v1 -> v2"]
    assert edit.notes == ()
    again = verbs.upgrade(_node({key: "v2"}), _module("v2"), "v2")
    assert again.body is None and again.already == f"node/n1: label {key} is already v2"


def test_upgrade_says_when_the_label_waits_for_the_module() -> None:
    ahead = verbs.upgrade(_node(), _module("v1"), "v2")
    assert ahead.notes == (
        "Module drivers/xe is at version v1: node/n1 keeps what it runs until the Module's "
        "version is v2",
    )
    unversioned = verbs.upgrade(_node(), _module(None), "v2")
    assert "sets no spec.moduleLoader.container.version" in unversioned.notes[0]


def test_upgrade_refuses_bad_versions_and_keys() -> None:
    for bad in ("", "v 2", "-v2", "v" * 64):
        with pytest.raises(click.UsageError, match="is not a label value"):
            verbs.upgrade(_node(), _module("v2"), bad)
    long = _module("v2")
    long["metadata"]["name"] = "x" * 60
    with pytest.raises(click.ClickException, match="longer than 63 characters"):
        verbs.upgrade(_node(), long, "v2")
