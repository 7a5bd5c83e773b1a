"""Who may hold the replicas' Lease, and when its holder must stop: pure rules, no I/O.

The rules are client-go's leader election, with the holder fencing itself:

- A candidate takes the Lease when no one holds it, or when the record it reads has not
  changed for ``lease`` seconds by the candidate's own clock. The holder's timestamps are
  never compared with the candidate's clock: two machines' clocks differ.
- The holder renews every ``retry`` seconds. Once no renewal has landed for ``deadline``
  seconds (less than ``lease``), it stops at once. A candidate sees a renewal only after
  it landed, so it takes over no sooner than ``lease`` seconds after the holder's last
  renewal was sent, by when the holder has been gone ``lease - deadline - retry`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    lease: float = 15.0
    deadline: float = 10.0
    retry: float = 2.0

    def __post_init__(self) -> None:
        # A renewal may take up to ``retry`` to answer before the holder sees it failed.
        if not self.deadline + self.retry < self.lease:
            raise ValueError(f"{self}: deadline + retry must be less than lease")


TIMING = Timing()
"""client-go's defaults."""


@dataclass(frozen=True)
class Seen:
    """A version of the Lease record, and when this candidate first read it."""

    holder: str
    version: str
    at: float


def observe(before: Seen | None, holder: str, version: str, now: float) -> Seen:
    """What a candidate knows after reading the record at ``now``: the time it first saw a
    version is kept until the version changes."""
    if before is not None and before.version == version:
        return before
    return Seen(holder, version, now)


def may_take(seen: Seen, me: str, now: float, timing: Timing) -> bool:
    return not seen.holder or seen.holder == me or now - seen.at >= timing.lease


def must_stop(last_renewal_sent: float, now: float, timing: Timing) -> bool:
    """Whether a holder whose last landed renewal was sent at ``last_renewal_sent`` must stop
    now: a candidate may take the Lease ``lease`` seconds after it."""
    return now - last_renewal_sent >= timing.deadline
