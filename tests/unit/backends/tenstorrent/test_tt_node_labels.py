"""The node labels the Tenstorrent policies say their passes read (``Resource.node_labels``):
a change of any other label of a node leaves the plan as it was, so a pass it does not wake
would have changed nothing. Policies, their selectors and the builder DaemonSets (made from
older selectors, as a DaemonSet not yet applied again is) are generated; every label of
every node the policy says it does not read is changed, added or removed in turn."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.backends import tenstorrent
from kmodkit.backends.tenstorrent import driver_owners, driver_plan, firmware_plan, names
from kmodkit.backends.tenstorrent.keys import (
    TT_DRIVER_SKIP_LABEL,
    TT_FIRMWARE_SKIP_LABEL,
    TT_FW_VERSION_LABEL,
    TT_INSTALL_MODE_LABEL,
    TT_KMD_VERSION_LABEL,
    TT_PCI_PRESENT_LABEL,
)
from kmodkit.core.contract.backend import ClusterView, Plan
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime.resource_controller import ROLLOUT_LABELS
from kmodkit.sdk import RolloutKeys
from tests.unit.backends.cached import as_cached

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
SELECTED_BY = ["pool", "zone"]
FOREIGN = ["kmm.node.kubernetes.io/ns.m.ready", "nfd.example.com/cpu", "team"]
OWN = [TT_DRIVER_SKIP_LABEL, TT_FIRMWARE_SKIP_LABEL, TT_KMD_VERSION_LABEL, TT_INSTALL_MODE_LABEL]
DRIVER_STATE = RolloutKeys.for_policy(names.driver_policy_id("p0")).state
FIRMWARE_STATE = RolloutKeys.for_policy(names.firmware_policy_id("p0")).state
OWN_VALUES = ["true", "host", "2.9.0", "2.8.0", "draining", "done"]
LABELS = [*SELECTED_BY, *FOREIGN, *OWN, TT_FW_VERSION_LABEL, DRIVER_STATE, FIRMWARE_STATE]

match_labels = st.dictionaries(
    st.sampled_from([*SELECTED_BY, *FOREIGN]), st.sampled_from(["a", "b"]), max_size=2
)
expressions = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from([*SELECTED_BY, *FOREIGN]),
            "operator": st.sampled_from(["Exists", "DoesNotExist"]),
        }
    ),
    max_size=2,
)
selectors = st.fixed_dictionaries({"matchLabels": match_labels, "matchExpressions": expressions})
nodes = st.lists(
    st.builds(
        lambda plain, own, pci: {**plain, **own, **({TT_PCI_PRESENT_LABEL: "true"} if pci else {})},
        st.dictionaries(
            st.sampled_from([*SELECTED_BY, *FOREIGN]), st.sampled_from(["a", "b"]), max_size=4
        ),
        st.dictionaries(
            st.sampled_from([*OWN, TT_FW_VERSION_LABEL, DRIVER_STATE, FIRMWARE_STATE]),
            st.sampled_from(OWN_VALUES),
            max_size=2,
        ),
        st.booleans(),
    ),
    min_size=1,
    max_size=4,
)


def _policy(kind: str, i: int, selector: dict[str, Any]) -> dict[str, Any]:
    group = "driver" if kind == "driver" else "firmware"
    return {
        "apiVersion": f"{group}.tenstorrent.com/v1alpha1",
        "kind": f"Tenstorrent{kind.capitalize()}Policy",
        "metadata": {
            "name": f"p{i}",
            "generation": 1,
            "uid": f"uid-p{i}",
            "creationTimestamp": f"2026-11-0{i + 1}T00:00:00Z",
        },
        "spec": {"version": "2.9.0", "nodeAffinity": selector},
    }


def _view(fleet: list[NodeView], watched: dict[str, list[Any]], owned: list[Any]) -> ClusterView:
    return ClusterView(
        nodes=fleet,
        api_groups=frozenset(),
        operator_namespace="ops",
        watched=as_cached(tenstorrent.backend, watched),
        owned=owned,
    )


def _builder_set(plan: Plan) -> dict[str, Any]:
    return next(o for o in plan.objects if o["kind"] == "DaemonSet")


def _unread_changes(fleet: list[NodeView], read: Callable[[str], bool]) -> list[list[NodeView]]:
    """The fleet with one label the policy does not read changed, added or removed."""
    changed = []
    for i, node in enumerate(fleet):
        for key in (k for k in LABELS if not read(k)):
            for value in (None, "a", "b"):
                labels = {k: v for k, v in node.labels.items() if k != key}
                if value is not None:
                    labels[key] = value
                if labels != node.labels:
                    changed.append([*fleet[:i], replace(node, labels=labels), *fleet[i + 1 :]])
    return changed


def _reads(declared: Callable[[str], bool]) -> Callable[[str], bool]:
    """As the runtime asks it: the rollout's own labels are read by every policy with hooks."""
    return lambda key: key.startswith(ROLLOUT_LABELS) or declared(key)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(selectors, min_size=1, max_size=3),
    st.lists(selectors, min_size=1, max_size=3),
    nodes,
)
def test_a_driver_policys_plan_moves_with_no_label_it_does_not_read(
    current: list[dict[str, Any]], previous: list[dict[str, Any]], labels: list[dict[str, str]]
) -> None:
    fleet = [NodeView(f"n{i}", labels=ls, ready=True) for i, ls in enumerate(labels)]
    policies = [_policy("driver", i, s) for i, s in enumerate(current)]
    # The builder DaemonSets as planned for the selectors before (one may not have been
    # applied again yet): their affinities name those keys.
    before = [_policy("driver", i, s) for i, s in enumerate(previous)]
    sets = [
        _builder_set(driver_plan.plan_at(p, _view(fleet, {driver_plan.POLICIES: before}, []), NOW))
        for p in before
    ]
    body = policies[0]
    watched = {driver_plan.POLICIES: policies, driver_plan.BUILDER_SETS: sets}
    owned = sets[:1]
    read = _reads(driver_owners.node_labels(body, _view(fleet, watched, owned).watched))
    planned = driver_plan.plan_at(body, _view(fleet, watched, owned), NOW)
    for other in _unread_changes(fleet, read):
        assert driver_plan.plan_at(body, _view(other, watched, owned), NOW) == planned, other


@settings(max_examples=300, deadline=None)
@given(st.lists(selectors, min_size=1, max_size=3), nodes)
def test_a_firmware_policys_plan_moves_with_no_label_it_does_not_read(
    current: list[dict[str, Any]], labels: list[dict[str, str]]
) -> None:
    fleet = [NodeView(f"n{i}", labels=ls, ready=True) for i, ls in enumerate(labels)]
    policies = [_policy("firmware", i, s) for i, s in enumerate(current)]
    body = policies[0]
    watched = {firmware_plan.POLICIES: policies}
    read = _reads(firmware_plan.node_labels(body, _view(fleet, watched, []).watched))
    planned = firmware_plan.plan_at(body, _view(fleet, watched, []), NOW)
    for other in _unread_changes(fleet, read):
        assert firmware_plan.plan_at(body, _view(other, watched, []), NOW) == planned, other


def test_labels_of_other_controllers_are_not_read_and_their_own_and_selectors_are() -> None:
    body = _policy("driver", 0, {"matchLabels": {"pool": "a"}})
    other = _policy("driver", 1, {"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
    read = driver_owners.node_labels(body, {driver_plan.POLICIES: [other]})
    keys = [*SELECTED_BY, *FOREIGN, *OWN, TT_PCI_PRESENT_LABEL]
    assert [k for k in keys if read(k)] == [*SELECTED_BY, *OWN, TT_PCI_PRESENT_LABEL]
    assert read("tt-smi.driver.tenstorrent.com/version") and not read("tenstorrent.com.evil/x")
