"""One rollout pass against a fake core API: when the swap hook may be called.

The swap (reloading a driver, flashing firmware) must follow a write that proves
the pass's view of the node current. A pass planning from an older view (a
replica that lost leadership but still runs, a lagging cache) is refused before
it swaps anything, whatever the node has become since.
"""

from __future__ import annotations

import copy
import json
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kmodkit.core.contract.hooks import Obj, Pending, Validation
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout import reconcile as reconcile_module
from kmodkit.core.rollout.keys import HOLDER_ANNOTATION, RolloutKeys
from kmodkit.core.rollout.reconcile import reconcile
from kmodkit.core.rollout.states import IN_FLIGHT
from kmodkit.core.rollout.status import RolloutStatus

POLICY = "fw.fleet"
KEYS = RolloutKeys.for_policy(POLICY)
OTHER = RolloutKeys.for_policy("drv.fleet")
TARGET = "v2"
NOW = 1_000_000.0


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            _merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


ANSWERED = SimpleNamespace(read=lambda: b"{}")
"""A raw answer, as the client returns one without preloading."""


class FakeCore:
    """The node calls a pass makes, with the apiserver's resourceVersion semantics: a
    patch carrying another resourceVersion than the node's is refused with 409, and a
    patch that changes nothing leaves the resourceVersion as it was."""

    def __init__(self, *nodes: Obj, answers_without_version: bool = False) -> None:
        self.nodes = {str(n["metadata"]["name"]): copy.deepcopy(n) for n in nodes}
        self.calls: list[tuple[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        """(kind of the object, reason) of each Event created."""
        self.answers_without_version = answers_without_version

    def patch_node(self, name: str, body: dict[str, Any], **kwargs: Any) -> Any:
        assert kwargs.get("_preload_content") is False, "the answer is read as raw JSON"
        if name not in self.nodes:
            raise ApiException(status=404)
        node = self.nodes[name]
        meta = node["metadata"]
        guard = body["metadata"].get("resourceVersion")
        if guard and guard != meta["resourceVersion"]:
            self.calls.append(("refused", copy.deepcopy(body)))
            raise ApiException(status=409, reason="Conflict")
        self.calls.append(("patch", copy.deepcopy(body)))
        before = copy.deepcopy(node)
        _merge(node, body)
        meta["resourceVersion"] = before["metadata"]["resourceVersion"]
        if node != before:
            self.touch(name)
        answer = {"metadata": {}} if self.answers_without_version else node
        return SimpleNamespace(data=json.dumps(answer).encode())

    def touch(self, name: str) -> None:
        meta = self.nodes[name]["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def list_node(self, label_selector: str, **kwargs: Any) -> Any:
        """The nodes in flight for POLICY (the one selector a pass lists by), as raw JSON."""
        assert label_selector.startswith(f"{KEYS.state} in (")
        assert kwargs.get("_preload_content") is False, "the answer is read as raw JSON"
        self.calls.append(("list", label_selector))
        flying = {s.value for s in IN_FLIGHT}
        items = [
            n for n in self.nodes.values() if n["metadata"]["labels"].get(KEYS.state) in flying
        ]
        return SimpleNamespace(data=json.dumps({"items": items}).encode())

    def list_pod_for_all_namespaces(self, **_: Any) -> Any:
        raise AssertionError("no node in these tests needs its pods")

    def create_namespaced_event(self, namespace: str, body: Any, **_: Any) -> Any:
        self.calls.append(("event", body["reason"]))
        self.events.append((body["involvedObject"]["kind"], body["reason"]))
        return ANSWERED

    def patch_namespaced_event(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        self.calls.append(("event", name))  # the process remembers a transition it posted
        return ANSWERED


class Hooks:
    """A backend whose swap is idempotent; ``touches`` makes its first swap write the node."""

    def __init__(self, core: FakeCore, touches: bool = False) -> None:
        self.core = core
        self.touches = touches

    def needs_update(self, node: Obj) -> bool:
        return True

    def swap(self, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        self.core.calls.append(("swap", name))
        if self.touches:
            self.touches = False
            self.core.touch(name)

    def validate(self, node: Obj) -> Validation:
        return Pending("loading")

    def is_device_consumer(self, pod: Obj) -> bool:
        return False


def swapping(rv: str = "7", **annotations: str) -> Obj:
    """A node in ``swapping`` for POLICY, as observed at resourceVersion ``rv``."""
    return {
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "resourceVersion": rv,
            "labels": {KEYS.state: "swapping"},
            "annotations": {
                KEYS.since: str(int(NOW)),
                KEYS.target: TARGET,
                KEYS.cordon: "rollout",
                HOLDER_ANNOTATION: POLICY,
                **annotations,
            },
        },
        "spec": {"unschedulable": True},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def moved_on(node: Obj, rv: str, state_labels: dict[str, str], holder: str | None) -> Obj:
    newer = copy.deepcopy(node)
    newer["metadata"]["resourceVersion"] = rv
    newer["metadata"]["labels"] = state_labels
    annotations = newer["metadata"]["annotations"]
    annotations.pop(HOLDER_ANNOTATION)
    if holder is not None:
        annotations[HOLDER_ANNOTATION] = holder
    return newer


def run_pass(
    monkeypatch: pytest.MonkeyPatch, core: FakeCore, hooks: Hooks, view: Obj
) -> RolloutStatus:
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    policy = UpgradePolicy(validation_timeout_seconds=600)
    return reconcile(None, POLICY, policy, [view], hooks, target=TARGET, now=NOW + 5)


def kinds(core: FakeCore) -> list[str]:
    return [kind for kind, _ in core.calls if kind != "event"]


@pytest.mark.parametrize(
    ("labels", "holder"),
    [
        # The pass that swapped the node has since moved it on to validating.
        ({KEYS.state: "validating"}, POLICY),
        # This rollout finished the node, and another one has claimed and drained it.
        ({KEYS.state: "done", OTHER.state: "draining"}, OTHER.holder_id),
    ],
    ids=["moved-on", "held-by-another-rollout"],
)
def test_a_stale_view_never_calls_the_swap_hook(
    monkeypatch: pytest.MonkeyPatch, labels: dict[str, str], holder: str
) -> None:
    old = swapping(rv="7")
    core = FakeCore(moved_on(old, "12", labels, holder))
    now_on_cluster = copy.deepcopy(core.nodes)
    status = run_pass(monkeypatch, core, Hooks(core), old)
    assert kinds(core) == ["refused"], core.calls
    assert core.nodes == now_on_cluster, "a refused pass changed the node"
    assert status.transitions == {}


def test_a_current_view_swaps_between_the_marker_write_and_the_state_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = FakeCore(swapping(rv="7"))
    run_pass(monkeypatch, core, Hooks(core), swapping(rv="7"))
    assert kinds(core) == ["patch", "swap", "patch"], core.calls
    marker, state = (body for kind, body in core.calls if kind == "patch")
    assert marker["metadata"] == {"annotations": {KEYS.swap: TARGET}, "resourceVersion": "7"}
    # Guarded by what the marker write returned, not by the view's resourceVersion.
    assert state["metadata"]["resourceVersion"] == "8"
    node = core.nodes["n1"]["metadata"]
    assert node["labels"][KEYS.state] == "validating"
    assert KEYS.swap not in node["annotations"], "the marker outlived the swap"


def test_a_swap_that_changed_the_node_is_called_again_on_the_next_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = FakeCore(swapping(rv="7"))
    hooks = Hooks(core, touches=True)
    run_pass(monkeypatch, core, hooks, swapping(rv="7"))
    assert kinds(core) == ["patch", "swap", "refused"], core.calls
    node = core.nodes["n1"]
    assert node["metadata"]["labels"][KEYS.state] == "swapping"
    assert node["metadata"]["annotations"][KEYS.swap] == TARGET
    core.calls.clear()
    # The marker is already there: rewriting it changes nothing and still proves the view.
    run_pass(monkeypatch, core, hooks, copy.deepcopy(node))
    assert kinds(core) == ["patch", "swap", "patch"], core.calls
    assert core.nodes["n1"]["metadata"]["labels"][KEYS.state] == "validating"
    assert KEYS.swap not in core.nodes["n1"]["metadata"]["annotations"]


def test_a_view_without_a_resource_version_never_swaps(monkeypatch: pytest.MonkeyPatch) -> None:
    core = FakeCore(swapping(rv="7"))
    view = swapping()
    del view["metadata"]["resourceVersion"]
    run_pass(monkeypatch, core, Hooks(core), view)
    assert kinds(core) == [], core.calls


def test_no_swap_on_an_answer_without_a_resource_version(monkeypatch: pytest.MonkeyPatch) -> None:
    # Guarded by nothing, the state write after the swap could land over a newer node.
    core = FakeCore(swapping(rv="7"), answers_without_version=True)
    status = run_pass(monkeypatch, core, Hooks(core), swapping(rv="7"))
    assert kinds(core) == ["patch"], core.calls
    assert any("no resourceVersion" in e for e in status.errors), status.errors


@pytest.mark.parametrize(
    ("state", "on_policy"),
    [
        # A routine move: the node's Event only.
        ("swapping", []),
        # A node's outcome: the policy hears of it too.
        ("uncordoning", [("ConfigMap", "RolloutDone")]),
        # An exception (started, then down before it was touched): so does the policy.
        ("cordoning-down", [("ConfigMap", "NodeNotReady")]),
    ],
)
def test_the_policy_hears_of_outcomes_not_of_every_move(
    monkeypatch: pytest.MonkeyPatch, state: str, on_policy: list[tuple[str, str]]
) -> None:
    node = swapping(rv="7")
    # Objects of their own: the process remembers the Events other tests posted.
    node["metadata"].update(labels={KEYS.state: state.split("-")[0]}, uid=str(uuid.uuid4()))
    if state.endswith("-down"):
        node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    core = FakeCore(node)
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": str(uuid.uuid4())}
    policy = UpgradePolicy(validation_timeout_seconds=600)
    status = reconcile(
        None, POLICY, policy, [node], Hooks(core), target=TARGET, now=NOW + 5, involved=involved
    )
    assert sum(status.transitions.values()) == 1, status
    (moved,) = [e for e in core.events if e[0] == "Node"]
    assert [e for e in core.events if e[0] != "Node"] == on_policy, core.events
    assert on_policy == [] or moved[1] == on_policy[0][1]


def _node(name: str, state: str | None) -> Obj:
    """A Ready node ``name``, uncordoned, in ``state`` of POLICY's rollout (None: idle)."""
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "3",
            "labels": {KEYS.state: state} if state else {},
            "annotations": {},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.mark.parametrize("n2_in_cluster", [None, "cordoning"])
def test_a_start_waits_while_the_apiserver_shows_more_nodes_in_flight(
    monkeypatch: pytest.MonkeyPatch, n2_in_cluster: str | None
) -> None:
    """The pass was handed n2 idle, the apiserver has it cordoning (the cache lags): its
    budget of one may be used up, so n1 does not start before a pass sees the node as it is."""
    core = FakeCore(_node("n1", "required"), _node("n2", n2_in_cluster))
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    views = [_node("n1", "required"), _node("n2", None)]
    policy = UpgradePolicy(max_unavailable=1)
    hooks = Hooks(core)
    hooks.needs_update = lambda node: node["metadata"]["name"] == "n1"  # type: ignore[method-assign]
    reconcile(None, POLICY, policy, views, hooks, target=TARGET, now=NOW)
    started = core.nodes["n1"]["metadata"]["labels"][KEYS.state] == "cordoning"
    assert started is (n2_in_cluster is None), core.calls
    assert [kind for kind, _ in core.calls if kind == "list"] == ["list"]


def gating(name: str, rv: str) -> Obj:
    """A node this rollout has cordoned and claimed, in ``gating``."""
    node = swapping(rv=rv)
    node["metadata"]["name"] = name
    node["metadata"]["uid"] = f"uid-{name}"
    node["metadata"]["labels"] = {KEYS.state: "gating"}
    return node


def test_a_node_that_left_the_request_is_released_guarded_and_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left = gating("left", rv="7")
    core = FakeCore(left)
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "namespace": "ns", "uid": "u"}
    status = reconcile(
        None,
        POLICY,
        UpgradePolicy(),
        [],
        Hooks(core),
        target=TARGET,
        now=NOW,
        involved=involved,
        known_nodes=[left],
    )
    patches = [body for kind, body in core.calls if kind == "patch"]
    assert len(patches) == 1 and patches[0]["metadata"]["resourceVersion"] == "7"
    node = core.nodes["left"]
    assert not node["spec"].get("unschedulable"), "left cordoned"
    assert KEYS.state not in node["metadata"]["labels"]
    assert HOLDER_ANNOTATION not in node["metadata"]["annotations"], "claim left behind"
    assert not any(k.startswith(KEYS.state) for k in node["metadata"]["annotations"])
    assert [c for c in core.calls if c == ("event", "RolloutReleased")] == [
        ("event", "RolloutReleased")
    ] * 2  # on the node and on the policy
    assert status.released == 1 and status.writes == 1
    assert status.transitions == {"idle": 1}
    assert [(n.name, n.state, n.reason) for n in status.untargeted] == [
        ("left", "idle", "RolloutReleased")
    ]
    assert status.summary.targeted == 0


def test_a_release_from_a_stale_view_is_refused_and_not_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = gating("left", rv="7")
    core = FakeCore(gating("left", rv="9"))
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    status = reconcile(
        None, POLICY, UpgradePolicy(), [], Hooks(core), target=TARGET, now=NOW, known_nodes=[seen]
    )
    assert kinds(core) == ["refused"], core.calls
    assert core.nodes["left"]["spec"]["unschedulable"] is True
    assert status.released == 0 and status.untargeted == []


def test_a_failed_node_that_left_is_kept_cordoned_without_a_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = gating("kept", rv="7")
    failed["metadata"]["labels"] = {KEYS.state: "failed"}
    failed["metadata"]["annotations"][KEYS.reason] = "ValidationTimeout"
    core = FakeCore(failed)
    monkeypatch.setattr(reconcile_module, "client", SimpleNamespace(CoreV1Api=lambda api: core))
    status = reconcile(
        None, POLICY, UpgradePolicy(), [], Hooks(core), target=TARGET, now=NOW, known_nodes=[failed]
    )
    assert kinds(core) == [], core.calls
    assert ("event", "LeftFailed") in core.calls, core.calls  # the admin is told why
    assert status.released == 0 and status.writes == 0 and status.transitions == {}
    assert [(n.name, n.state, n.reason) for n in status.untargeted] == [
        ("kept", "failed", "LeftFailed")
    ]
