"""Writes that landed but that the watch has not delivered yet.

A pass plans from the watch caches. When the next pass starts before the watch
has delivered the previous pass's writes (a pod status event arrives first, or
the fleet is large and the watch is behind), the plan asks for the same writes
again: a create refused with 409, a label patched to what it already is. At
scale that doubles the writes. A write that landed is remembered until the
caches show it, and not sent again meanwhile. The memory is bounded in time, so
a write the caches never show (its object changed again before the watch caught
up, an event folded into a relist) is sent again late, never lost.

Nothing here is progress: a restarted operator has an empty memory and plans
from the cluster, as always.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

PATIENCE_SECONDS = 30.0
"""How long a landed write may stay unseen before it is sent again."""


@dataclass
class UnseenWrites:
    patience: float = PATIENCE_SECONDS
    clock: Callable[[], float] = time.monotonic
    _until: dict[Hashable, float] = field(default_factory=dict)

    def landed(self, write: Hashable) -> None:
        self._until[write] = self.clock() + self.patience

    def forget_seen(self, seen: Callable[[Hashable], bool]) -> None:
        """Forget the writes the caches now show (``seen``), and those waited on too long."""
        now = self.clock()
        self._until = {w: t for w, t in self._until.items() if t > now and not seen(w)}

    def unseen(self, write: Hashable) -> bool:
        """Whether ``write`` landed and the caches do not show it yet: do not send it again."""
        return self._until.get(write, 0.0) > self.clock()

    def next_due(self) -> float | None:
        """Seconds until the first remembered write may be sent again (None: none is)."""
        now = self.clock()
        return min((t - now for t in self._until.values()), default=None)
