"""The Lease rules: who may take it, when a holder must stop, and that the two never
leave room for two holders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmodkit.core.election import TIMING, Seen, Timing, may_take, must_stop, observe


def test_a_version_keeps_the_time_it_was_first_seen_until_it_changes() -> None:
    first = observe(None, "a", "1", now=10.0)
    assert observe(first, "a", "1", now=14.0) == Seen("a", "1", 10.0)
    assert observe(first, "a", "2", now=14.0) == Seen("a", "2", 14.0)


def test_a_held_lease_is_taken_only_once_seen_unchanged_for_its_duration() -> None:
    seen = Seen("other", "7", at=100.0)
    assert not may_take(seen, "me", 100.0 + TIMING.lease - 0.01, TIMING)
    assert may_take(seen, "me", 100.0 + TIMING.lease, TIMING)


def test_a_free_lease_or_our_own_is_taken_at_once() -> None:
    assert may_take(Seen("", "7", at=100.0), "me", 100.0, TIMING)
    assert may_take(Seen("me", "7", at=100.0), "me", 100.0, TIMING)


def test_a_holder_stops_once_no_renewal_landed_for_the_deadline() -> None:
    assert not must_stop(50.0, 50.0 + TIMING.deadline - 0.01, TIMING)
    assert must_stop(50.0, 50.0 + TIMING.deadline, TIMING)


def test_timings_that_leave_no_gap_are_refused() -> None:
    with pytest.raises(ValueError, match="deadline"):
        Timing(lease=10.0, deadline=9.0, retry=2.0)


@settings(max_examples=2000)
@given(
    sent=st.floats(0, 1000),
    landed_after=st.floats(0, TIMING.retry),
    read_after=st.floats(0, 5),
    waits=st.lists(st.floats(0, 2 * TIMING.lease), min_size=1, max_size=3),
)
def test_no_candidate_takes_the_lease_while_its_holder_may_still_run(
    sent: float, landed_after: float, read_after: float, waits: list[float]
) -> None:
    """The holder's last renewal is sent at ``sent`` and lands (a new version) up to
    ``retry`` later; a candidate first reads that version some time after it landed and
    reads again later. Whenever the candidate may take the Lease, the holder has already
    seen it must stop, and had time to (its check runs at least every ``retry``)."""
    now = sent + landed_after + read_after
    seen = observe(Seen("holder", "6", 0.0), "holder", "7", now)
    for wait in sorted(waits):
        later = seen.at + wait
        seen = observe(seen, "holder", "7", later)
        if may_take(seen, "me", later, TIMING):
            assert must_stop(sent, later - TIMING.retry, TIMING)
