"""What an Event costs in writes: the correlator's decisions, with no cluster."""

from __future__ import annotations

from kmodkit.core.events import (
    COMBINED,
    CONDITION_REPEAT_SECONDS,
    ONCE,
    SIMILAR_LIMIT,
    SIMILAR_WINDOW,
    Correlator,
    Event,
    Write,
    event,
)

NODE = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
LOADED = event(NODE, "ModuleLoaded", "Module ns/m loaded into the kernel", warning=False)


def _post(
    c: Correlator, ev: Event = LOADED, now: float = 0.0, repeat_after: float = 0.0
) -> Write | None:
    write = c.decide(ev, now, repeat_after)
    if write is not None:
        c.posted(write, write.count, now)
    return write


def test_an_event_that_happens_again_raises_the_count_of_the_same_event() -> None:
    c = Correlator()
    first = _post(c)
    again = _post(c, now=1.0)
    assert first is not None and first.create and first.count == 1
    assert again is not None and not again.create
    assert (again.name, again.count) == (first.name, 2)


def test_an_events_name_is_derived_from_its_content_so_a_restart_finds_it() -> None:
    first = Correlator().decide(LOADED, 0.0, 0.0)
    after_restart = Correlator().decide(LOADED, 99.0, 0.0)
    other_node = Correlator().decide(
        event({**NODE, "name": "n2", "uid": "u2"}, LOADED.reason, LOADED.message, False), 0, 0
    )
    assert first is not None and after_restart is not None and other_node is not None
    assert first.name == after_restart.name and first.name.startswith("n1.")
    assert other_node.name != first.name


def test_a_condition_is_reported_again_only_after_its_interval() -> None:
    c = Correlator()
    assert _post(c, repeat_after=CONDITION_REPEAT_SECONDS) is not None
    soon = _post(c, now=CONDITION_REPEAT_SECONDS - 1, repeat_after=CONDITION_REPEAT_SECONDS)
    later = _post(c, now=CONDITION_REPEAT_SECONDS + 1, repeat_after=CONDITION_REPEAT_SECONDS)
    assert soon is None
    assert later is not None and later.count == 2


def test_a_once_only_event_is_never_written_twice() -> None:
    c = Correlator()
    assert _post(c, repeat_after=ONCE) is not None
    assert _post(c, now=1e9, repeat_after=ONCE) is None


def test_similar_events_beyond_the_limit_are_combined_into_one() -> None:
    c = Correlator()

    def on(node: int, now: float = 1.0) -> Write | None:
        ev = event(NODE, "RolloutDone", f"rollout p on node n{node}: done", warning=False)
        return _post(c, ev, now=now)

    distinct = [on(i) for i in range(SIMILAR_LIMIT)]
    assert all(w is not None and w.create for w in distinct)
    assert len({w.name for w in distinct if w}) == SIMILAR_LIMIT
    combined, more = on(SIMILAR_LIMIT), on(SIMILAR_LIMIT + 1)
    assert combined is not None and combined.create
    assert combined.message == f"{COMBINED}rollout p on node n{SIMILAR_LIMIT}: done"
    assert more is not None and (more.name, more.count) == (combined.name, 2)
    assert more.message.endswith(f"n{SIMILAR_LIMIT + 1}: done")
    # A message already told keeps its own Event; another reason is not similar.
    known = on(0)
    assert known is not None and (known.name, known.count) == (distinct[0].name, 2)  # type: ignore[union-attr]
    other = _post(c, event(NODE, "RolloutFailed", "rollout p on node n99: failed", True), now=1)
    assert other is not None and other.create and not other.message.startswith(COMBINED)
    # Once the window has passed, messages are told one by one again.
    fresh = on(50, now=1.0 + SIMILAR_WINDOW + 1)
    assert fresh is not None and not fresh.message.startswith(COMBINED)


def test_the_oldest_event_is_forgotten_past_the_capacity() -> None:
    c = Correlator(capacity=2)
    evs = [event(NODE, f"R{i}", "m", warning=False) for i in range(3)]
    for ev in evs:
        _post(c, ev)
    kept = _post(c, evs[2], now=1)
    forgotten = _post(c, evs[0], now=1)
    assert kept is not None and not kept.create
    assert forgotten is not None and forgotten.create
