"""``kmodkit_dev.waiting.wait_until``: a timeout says what the state was, not only that it
was not the one waited for."""

from __future__ import annotations

import pytest

from kmodkit_dev.waiting import wait_until


def test_a_timeout_names_what_was_waited_for_and_what_explain_says() -> None:
    with pytest.raises(AssertionError) as err:
        wait_until(lambda: False, "the node upgraded", timeout=0, explain=lambda: "node-1 cordoned")
    assert "the node upgraded" in str(err.value)
    assert "node-1 cordoned" in str(err.value)


def test_explain_is_asked_only_on_a_timeout() -> None:
    def explain() -> str:
        raise AssertionError("explain asked although the probe succeeded")

    assert wait_until(lambda: "done", "anything", timeout=0, explain=explain) == "done"
