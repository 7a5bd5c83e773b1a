"""Which nodes a driver policy owns, and where its builder DaemonSet may place pods now.

The owner of a node is the oldest covering policy (``node_owners``); the builder
DaemonSet's affinity says so itself (``owned_affinity``), so the DaemonSet
controller keeps two policies' builders apart as node labels change, with no
pass in the loop.

When ownership moves (the owner is deleted, or its selector shrinks; an older
policy's selector grows), both DaemonSets change, each in its own policy's
pass, and a node must lose its old builder before it gets the new one. A pass
may always narrow its DaemonSet; it widens it onto a node only once no other
policy's DaemonSet, as last seen, matches that node and no other policy's
builder pod is left on it. Until then the node is held: its name is excluded in
the affinity, and the policy reports it waiting. The old owner's pass narrows
its DaemonSet without waiting for anything, so the two never wait on each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.driver_api import TenstorrentDriverPolicySpec
from kmodkit.backends.tenstorrent.node_owners import Claim, claims, labels_read, owners
from kmodkit.backends.tenstorrent.owned_affinity import (
    MAX_TERMS,
    Term,
    affinity_terms,
    matcher,
    own_requirements,
    owned_terms,
    render,
)
from kmodkit.backends.tenstorrent.selection import NodeLabelSelector
from kmodkit.backends.tenstorrent.unknown_fields import parse_spec
from kmodkit.sdk import ClusterView, NodeView, Obj

BUILDERS = "builders"
"""The ``ClusterView.watched`` key of the builder pods."""
POLICIES = "driverpolicies"
"""The ``ClusterView.watched`` key of all driver policies (who owns a shared node)."""
BUILDER_SETS = "builderdaemonsets"
"""The ``ClusterView.watched`` key of every driver policy's builder DaemonSet."""


@dataclass(frozen=True)
class Ownership:
    owner: Mapping[str, str]
    """Each node any driver policy covers, and the policy that owns it."""
    terms: list[Term]
    """The node selector terms of this policy's builder DaemonSet."""
    held: Mapping[str, str]
    """Nodes this policy owns that its DaemonSet does not take yet, each with why."""
    too_complex: tuple[str, ...] = ()
    """The older overlapping policies, when the overlap took more than ``MAX_TERMS`` terms and
    their nodes are excluded by name instead."""


def _selector_of(body: Obj) -> NodeLabelSelector | None:
    try:
        spec, _ = parse_spec(TenstorrentDriverPolicySpec, body.get("spec") or {})
    except ValidationError:
        return None  # an invalid policy is refused and claims no node
    return spec.selector()


def _policy_label(obj: Obj) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(keys.TT_DRIVER_POLICY_LABEL))


def _template_terms(ds: Obj) -> list[Term] | None:
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    return affinity_terms(spec)


def node_labels(body: Obj, watched: Mapping[str, Sequence[Obj]]) -> Callable[[str], bool]:
    """The node labels a driver policy's passes read: those of ``labels_read`` and every key
    a builder DaemonSet's node affinity names (whose nodes it places, and holds)."""
    placing = {
        expression.get("key", "")
        for ds in watched.get(BUILDER_SETS, ())
        for term in _template_terms(ds) or []
        for expression in term.get("matchExpressions") or []
    }
    return labels_read([body, *watched.get(POLICIES, ())], _selector_of, placing)


def ordered_claims(body: Obj, view: ClusterView) -> list[Claim]:
    """Every valid driver policy's claim, oldest first; this policy's own body counts even
    before the watch has seen it."""
    name = (body.get("metadata") or {}).get("name")
    others = [
        p for p in view.watched.get(POLICIES, ()) if (p.get("metadata") or {}).get("name") != name
    ]
    return claims([*others, body], _selector_of)


def _held(
    policy: str,
    wanted: Sequence[Term],
    view: ClusterView,
    own_sets: Sequence[Obj],
    nodes: Sequence[NodeView],
) -> dict[str, str]:
    mine = names.label_value(policy)
    # Each set of terms is compiled once: a DaemonSet holding many nodes back names each.
    wanted_here = matcher(wanted)
    placed = matcher([t for ds in own_sets for t in (_template_terms(ds) or [])])
    others = [
        (_policy_label(ds), matcher(_template_terms(ds)))
        for ds in view.watched.get(BUILDER_SETS, ())
        if _policy_label(ds) != mine
    ]
    pods: dict[str, str] = {}
    for pod in view.watched.get(BUILDERS, ()):
        on = str((pod.get("spec") or {}).get("nodeName") or "")
        if on and _policy_label(pod) != mine:
            pods.setdefault(on, str((pod.get("metadata") or {}).get("name", "")))
    held: dict[str, str] = {}
    for node in nodes:
        if not wanted_here(node.name, node.labels):
            continue
        if own_sets and placed(node.name, node.labels):
            continue  # already placed there: holding it now would remove this policy's builder
        placing = next((label for label, places in others if places(node.name, node.labels)), None)
        if placing is not None:
            held[node.name] = (
                f"the builder DaemonSet of driver policy {placing} still places its builder on "
                "the node; this policy's builder starts once that DaemonSet lets the node go"
            )
        elif node.name in pods:
            held[node.name] = (
                f"builder pod {pods[node.name]} of another driver policy is still on the node; "
                "this policy's builder starts once it is gone"
            )
    return held


def ownership(body: Obj, view: ClusterView, skip_label: str, require_pci: bool) -> Ownership:
    """Who owns each node, the affinity of this policy's DaemonSet, and the nodes it holds."""
    name = str((body.get("metadata") or {}).get("name", ""))
    ordered = ordered_claims(body, view)
    owner = owners(ordered, view.nodes, require_pci)
    index = next(i for i, c in enumerate(ordered) if c.name == name)
    selector, older = ordered[index].selector, ordered[:index]
    expressed = owned_terms(selector, [c.selector for c in older], skip_label, require_pci)
    too_complex: tuple[str, ...] = ()
    excluded: set[str] = set()
    if expressed is None:
        # Past the cap the nodes older policies own now are kept out by name: right for the
        # labels of this pass, and reported, since a relabelled node waits for the next pass.
        expressed = [own_requirements(selector, skip_label, require_pci)]
        excluded = {n for n, o in owner.items() if o != name}
        too_complex = tuple(c.name for c in older)
    own_sets = [o for o in view.owned if o.get("kind") == "DaemonSet"]
    wanted = render(expressed, excluded)
    held = _held(name, wanted, view, own_sets, view.nodes)
    terms = render(expressed, excluded | set(held)) if held else wanted
    return Ownership(owner, terms, held, too_complex)


def too_complex_message(older: Sequence[str]) -> str:
    return (
        f"this policy's node selector overlaps the older driver policies {', '.join(older)} in "
        f"more than {MAX_TERMS} combinations, too many to keep its builders off their nodes by "
        "labels; they are kept off by node name, so a node relabelled onto an older policy "
        "may run two builders until the next pass. Make the selectors disjoint, or simpler"
    )
