"""Which node changes wake a pass over a Module: those of the nodes it selects (before or
after), labels, or has pods on; no other node's."""

from __future__ import annotations

from kmodkit.core.engine.node_interest import module_interest
from kmodkit.core.nodes import NodeView

SELECTOR = {"accel": "xe"}
READY = "kmm.node.kubernetes.io/ns.xe.ready"


def _node(name: str = "n1", **labels: str) -> NodeView:
    return NodeView(name, labels=labels)


def test_a_change_on_a_node_it_neither_selects_labels_nor_has_pods_on_wakes_nothing() -> None:
    concerns = module_interest("ns", "xe", lambda: SELECTOR, lambda: ("other",))
    other = _node(zone="a")
    assert not concerns([(other, _node(zone="b")), (None, _node("n2")), (_node("n3"), None)])


def test_a_node_it_selects_before_or_after_the_change_concerns_it() -> None:
    concerns = module_interest("ns", "xe", lambda: SELECTOR, lambda: ())
    selected, plain = _node(accel="xe"), _node()
    assert concerns([(plain, selected)])  # now selected: load
    assert concerns([(selected, plain)])  # selected no more: unload
    assert concerns([(selected, None)])  # deleted
    assert concerns([(selected, _node(accel="xe", zone="b"))])  # any change of one it selects


def test_a_node_carrying_its_label_or_hosting_its_pod_concerns_it_though_not_selected() -> None:
    concerns = module_interest("ns", "xe", lambda: SELECTOR, lambda: ("n9",))
    assert concerns([(_node(**{READY: ""}), _node(**{READY: "", "zone": "b"}))])
    assert concerns([(_node("n9"), _node("n9", zone="b"))])
    other = module_interest("ns", "gpu", lambda: SELECTOR, lambda: ())
    assert not other([(_node(**{READY: ""}), _node(**{READY: "", "zone": "b"}))])


def test_the_selector_is_read_as_it_is_now() -> None:
    selector = {"accel": "xe"}
    concerns = module_interest("ns", "xe", lambda: selector, lambda: ())
    change = [(_node(accel="gpu"), _node(accel="gpu", zone="b"))]
    assert not concerns(change)
    selector = {"accel": "gpu"}
    assert concerns(change)


def test_a_module_whose_pass_must_report_a_problem_is_woken_by_every_change() -> None:
    change = [(_node(), _node(zone="b"))]
    assert module_interest("ns", "xe", lambda: ["not", "a", "map"], lambda: ())(change)
    assert module_interest("ns", "x" * 80, lambda: SELECTOR, lambda: ())(change)


def test_the_pods_nodes_are_read_once_a_batch() -> None:
    reads = []

    def hosts() -> tuple[str, ...]:
        reads.append(1)
        return ()

    concerns = module_interest("ns", "xe", lambda: SELECTOR, hosts)
    assert not concerns([(_node(f"n{i}"), _node(f"n{i}", zone="b")) for i in range(100)])
    assert len(reads) == 1
