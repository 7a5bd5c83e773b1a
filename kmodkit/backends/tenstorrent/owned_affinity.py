"""The builder DaemonSet's node affinity: the nodes its policy covers and owns.

Two driver policies covering one node must not both run a builder there, and
the DaemonSet controller places pods on its own as node labels change, before
any operator pass sees the change. So ownership (``node_owners``: the oldest
covering policy) is written into the affinity itself: "my selector, and no
older policy's selector". Nodes are never written to, nothing is stored, and a
node relabelled while the operator is down still gets the right builder.

A selector is a conjunction of requirements, so its complement is a
disjunction of the negated requirements (``In``/``NotIn``,
``Exists``/``DoesNotExist``; ``matchLabels k=v`` is ``k In [v]``). Node
selector terms are ORed and each term's expressions ANDed, so "mine and not
A and not B" is the product of the complements, one term per combination.
Combinations that cannot match (``pool In [a]`` with ``pool NotIn [a]``) are
dropped and a complement already implied by a term adds nothing to it, so
disjoint selectors, the usual case, leave the affinity as it was. The product
is capped (``MAX_TERMS``): past it the caller reports the overlap and keeps
the policy off the other policies' nodes by name instead.

``matches`` evaluates node selector terms as the scheduler does; the plan uses
it (``matcher``, for many nodes) to see where another policy's DaemonSet places builders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kmodkit.backends.tenstorrent import keys
from kmodkit.backends.tenstorrent.selection import NodeLabelSelector

MAX_TERMS = 64
"""Most node selector terms one builder affinity may have; more means the overlap is reported."""
NODE_NAME_FIELD = "metadata.name"

Expression = dict[str, Any]
Term = dict[str, list[Expression]]


@dataclass(frozen=True)
class Req:
    """One requirement on one label key (``values`` only for In and NotIn)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def expression(self) -> Expression:
        expr: Expression = {"key": self.key, "operator": self.operator}
        if self.operator in ("In", "NotIn"):
            expr["values"] = list(self.values)
        return expr


_NEGATION = {"In": "NotIn", "NotIn": "In", "Exists": "DoesNotExist", "DoesNotExist": "Exists"}


def negate(req: Req) -> Req:
    return Req(req.key, _NEGATION[req.operator], req.values)


def requirements(selector: NodeLabelSelector) -> list[Req]:
    """The selector's requirements in the order the builder affinity writes them."""
    found = [Req(k, "In", (v,)) for k, v in sorted((selector.match_labels or {}).items())]
    for r in selector.match_expressions or []:
        found.append(Req(r.key, r.operator, tuple(sorted(r.values or ()))))
    return found


@dataclass(frozen=True)
class _States:
    """The states of one label key a conjunction admits: absent, and which values.

    ``values`` lists the admitted values when ``listed``, the refused ones when not (every
    value but those); label values are unbounded, so an unlisted set is never empty.
    """

    absent: bool
    listed: bool
    values: frozenset[str]

    def meet(self, other: _States) -> _States:
        absent = self.absent and other.absent
        if self.listed and other.listed:
            return _States(absent, True, self.values & other.values)
        if self.listed:
            return _States(absent, True, self.values - other.values)
        if other.listed:
            return _States(absent, True, other.values - self.values)
        return _States(absent, False, self.values | other.values)

    def empty(self) -> bool:
        return not self.absent and self.listed and not self.values

    def within(self, other: _States) -> bool:
        if self.absent and not other.absent:
            return False
        if self.listed and other.listed:
            return self.values <= other.values
        if self.listed:
            return not self.values & other.values
        return not other.listed and other.values <= self.values


def _states(req: Req) -> _States:
    values = frozenset(req.values)
    if req.operator == "In":
        return _States(False, True, values)
    if req.operator == "NotIn":
        return _States(True, False, values)
    if req.operator == "Exists":
        return _States(False, False, frozenset())
    return _States(True, True, frozenset())


_ANY = _States(True, False, frozenset())


@dataclass(frozen=True)
class _Conjunction:
    """One term: the requirements it writes, and what they admit per key."""

    reqs: tuple[Req, ...]
    admits: Mapping[str, _States]

    @classmethod
    def of(cls, reqs: Iterable[Req]) -> _Conjunction | None:
        term = cls((), {})
        for req in reqs:
            joined = term.and_(req)
            if joined is None:
                return None
            term = joined
        return term

    def and_(self, req: Req) -> _Conjunction | None:
        """This term and ``req``; None when no node can match both."""
        states = self.admits.get(req.key, _ANY).meet(_states(req))
        if states.empty():
            return None
        return _Conjunction((*self.reqs, req), {**self.admits, req.key: states})

    def implies(self, req: Req) -> bool:
        return self.admits.get(req.key, _ANY).within(_states(req))

    def canonical(self) -> tuple[tuple[str, bool, bool, tuple[str, ...]], ...]:
        return tuple(
            (k, s.absent, s.listed, tuple(sorted(s.values))) for k, s in sorted(self.admits.items())
        )


def own_requirements(selector: NodeLabelSelector, skip_label: str, require_pci: bool) -> list[Req]:
    """What a builder needs whoever owns the node: the selector, the PCI label, no skip.

    The PCI label is required exactly when ``covers`` requires it; the skip label keeps the
    pod off only when it is ``true``, the same rule the status and the rollout apply.
    """
    reqs = requirements(selector)
    if require_pci:
        reqs.append(Req(keys.TT_PCI_PRESENT_LABEL, "In", ("true",)))
    reqs.append(Req(skip_label, "NotIn", ("true",)))
    return reqs


def owned_terms(
    selector: NodeLabelSelector,
    older: Sequence[NodeLabelSelector],
    skip_label: str,
    require_pci: bool,
    cap: int = MAX_TERMS,
) -> list[list[Req]] | None:
    """The terms of "covered by ``selector`` and by none of ``older``", each a list of
    requirements; [] when no node can match, None when it takes more than ``cap`` terms.

    The PCI label, when required, is in every term, so "not covered by an older policy"
    needs only its selector negated.
    """
    first = _Conjunction.of(own_requirements(selector, skip_label, require_pci))
    terms = [first] if first is not None else []
    for other in older:
        alternatives = [negate(r) for r in requirements(other)]
        grown: dict[Any, _Conjunction] = {}
        for term in terms:
            if any(term.implies(a) for a in alternatives):
                grown.setdefault(term.canonical(), term)
                continue
            for alternative in alternatives:
                joined = term.and_(alternative)
                if joined is not None:
                    grown.setdefault(joined.canonical(), joined)
        terms = list(grown.values())
        if len(terms) > cap:
            return None
    return [list(t.reqs) for t in terms]


def render(terms: Sequence[Sequence[Req]], excluded_nodes: Iterable[str] = ()) -> list[Term]:
    """Node selector terms for the terms, each keeping off ``excluded_nodes`` by name.

    No term at all must still be a valid affinity that matches no node: one term whose two
    expressions contradict each other.
    """
    fields = [
        {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [name]}
        for name in sorted(set(excluded_nodes))
    ]
    if not terms:
        never = keys.TT_PCI_PRESENT_LABEL
        return [
            {
                "matchExpressions": [
                    {"key": never, "operator": "Exists"},
                    {"key": never, "operator": "DoesNotExist"},
                ]
            }
        ]
    rendered: list[Term] = []
    for term in terms:
        one: Term = {"matchExpressions": [r.expression() for r in term]}
        if fields:
            one["matchFields"] = [dict(f) for f in fields]
        rendered.append(one)
    return rendered


def required_affinity(terms: list[Term]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def affinity_terms(pod_spec: Mapping[str, Any]) -> list[Term] | None:
    """The required node selector terms of a pod spec; None when it has none (any node)."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    return None if terms is None else list(terms)


def _expression_holds(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = expr.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def matcher(
    terms: Sequence[Mapping[str, Any]] | None,
) -> Callable[[str, Mapping[str, str]], bool]:
    """``matches`` for one set of terms, to ask of many nodes.

    A term keeps a node off by name with one ``metadata.name NotIn [node]`` field per node
    (``render``; the apiserver takes one value per name field), so a DaemonSet that holds
    back many nodes has that many fields. They are gathered into one set per term here, once:
    asked of every node of the fleet, each question costs a lookup, not a scan of the fields.
    """
    if terms is None:
        return lambda _name, _labels: True
    compiled: list[tuple[list[Mapping[str, Any]], frozenset[str], list[Mapping[str, Any]]]] = []
    for term in terms:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue  # an empty term matches nothing
        excluded: set[str] = set()
        other_fields = []
        for f in fields:
            if f.get("key") == NODE_NAME_FIELD and f.get("operator") == "NotIn":
                excluded.update(v for v in f.get("values") or [] if isinstance(v, str))
            else:
                other_fields.append(f)
        compiled.append((list(exprs), frozenset(excluded), other_fields))

    def match(node_name: str, node_labels: Mapping[str, str]) -> bool:
        for exprs, excluded, fields in compiled:
            if node_name in excluded:
                continue
            if all(_expression_holds(e, node_labels.get(str(e.get("key")))) for e in exprs) and all(
                f.get("key") == NODE_NAME_FIELD and _expression_holds(f, node_name) for f in fields
            ):
                return True
        return False

    return match


def matches(
    terms: Sequence[Mapping[str, Any]] | None, node_name: str, node_labels: Mapping[str, str]
) -> bool:
    """Whether required node selector terms admit a node, as the scheduler decides it:
    terms ORed, a term's expressions and fields ANDed, an empty term matching nothing."""
    return matcher(terms)(node_name, node_labels)
