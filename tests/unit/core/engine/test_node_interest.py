"""Which node changes wake a pass over a Module: those of the nodes it selects (before or
after), labels, or has pods on; no other node's. And over a backend resource's object: any
change but of labels it does not read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kmodkit.core.engine.node_interest import label_interest, module_interest, moved_labels
from kmodkit.core.nodes import NodeView, Taint

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


def test_a_backend_resource_is_woken_by_the_labels_it_reads_and_by_more_than_labels() -> None:
    asked: list[int] = []

    def reads() -> Callable[[str], bool]:
        asked.append(1)
        return lambda key: key.startswith("acme.example.com/")

    concerns = label_interest(reads)
    plain = _node(zone="a")
    # Another controller's labels, added, changed or removed: nothing it reads.
    assert not concerns(
        [(plain, _node(zone="b", **{READY: "true"})), (_node(**{READY: ""}), plain)]
    )
    assert len(asked) == 1  # once a batch
    assert concerns([(plain, _node(zone="a", **{"acme.example.com/version": "2"}))])
    assert concerns([(_node(**{"acme.example.com/version": "1"}), _node())])
    # Anything else of a node moved: every pass may read it.
    for moved in (
        replace(plain, kernel="6.1"),
        replace(plain, ready=True),
        replace(plain, unschedulable=True),
        replace(plain, taints=(Taint("k", "v", "NoSchedule"),)),
        replace(plain, boot_id="b2"),
    ):
        assert concerns([(plain, moved)]), moved
    assert concerns([(None, plain)]) and concerns([(plain, None)])
    asked.clear()
    label_interest(reads)([(None, plain)])
    assert not asked  # not needed, not asked
    assert moved_labels(plain, _node(zone="b", x="1")) == {"zone", "x"}
