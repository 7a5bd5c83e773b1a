"""The replicas' Lease on the real control plane: one holder, a standby that takes over only
once the holder has stopped, a holder that stops itself when it cannot renew, and a clean
hand-over.

The timings are shortened (a 3 s lease) so each case takes seconds; the rules do not
depend on the figures (``tests/unit/core/test_election.py``). The processes of
``kmodkit run`` with a Lease are ``tests/chaos/`` and ``tests/integration/test_chart.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmodkit.core.election import Timing
from kmodkit.core.runtime.lease import Lease
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.waiting import wait_until

pytestmark = pytest.mark.cluster

T = Timing(lease=3.0, deadline=2.0, retry=0.5)
NAME = "replicas"


class Candidate:
    """A Lease on a client of its own, acquired on a thread; records when it took the
    Lease and when it gave up holding it."""

    def __init__(self, cluster: devcluster.Cluster, namespace: str, me: str) -> None:
        self.api = devcluster.api_client(cluster)
        self.lease = Lease(self.api, namespace, NAME, me, timing=T)
        self.took: float | None = None
        self.lost: float | None = None
        self.cut = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.lease.acquire()
        self.took = time.monotonic()
        self.lease.hold(lost=self._lost)

    def _lost(self) -> None:
        self.lost = time.monotonic()

    def cut_off(self, hang: bool) -> None:
        """From now on every request fails as a refused connection does, or hangs as one to
        an apiserver that stopped answering: a stand-in, in the client, for a holder cut off
        from the apiserver."""

        def refused(*_: Any, **__: Any) -> Any:
            if hang:
                time.sleep(3600)
            raise ConnectionRefusedError("cut off")

        leases: Any = self.lease._leases
        leases.replace_namespaced_lease = leases.read_namespaced_lease = refused
        self.cut = True


@pytest.fixture
def candidates(dev_cluster: devcluster.Cluster, namespace: str) -> Iterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for c in made:
        if not c.cut:
            c.lease.release()


def _holder(kube_api: Any, namespace: str) -> str:
    lease: Any = client.CoordinationV1Api(kube_api).read_namespaced_lease(NAME, namespace)
    return str(lease.spec.holder_identity or "")


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "hanging"])
def test_a_holder_cut_off_stops_itself_before_the_standby_takes_over(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    namespace: str,
    candidates: list[Candidate],
    hang: bool,
) -> None:
    """However its renewals fail (refused at once, or never answered), the holder stops
    within the deadline, and the standby takes over only after that."""
    a = Candidate(dev_cluster, namespace, "a")
    candidates.append(a)
    wait_until(lambda: a.took, "a to take the free Lease")
    b = Candidate(dev_cluster, namespace, "b")
    candidates.append(b)
    time.sleep(3 * T.lease)  # a renews: b waits however long
    assert b.took is None and a.lost is None
    assert _holder(kube_api, namespace) == "a"

    a.cut_off(hang)
    cut = time.monotonic()
    wait_until(lambda: b.took, "b to take the Lease", timeout=30)
    assert a.lost is not None and b.took is not None
    assert cut + T.deadline - T.retry <= a.lost <= cut + T.deadline + 2 * T.retry
    # b took it no sooner than a lease after a's last renewal, and after a stopped.
    assert b.took - cut >= T.lease - T.retry
    assert a.lost < b.took
    assert _holder(kube_api, namespace) == "b"


def test_a_released_lease_is_taken_at_once(
    dev_cluster: devcluster.Cluster, kube_api: Any, namespace: str, candidates: list[Candidate]
) -> None:
    a = Candidate(dev_cluster, namespace, "a")
    wait_until(lambda: a.took, "a to take the free Lease")
    b = Candidate(dev_cluster, namespace, "b")
    candidates.append(b)
    time.sleep(T.lease)
    released = time.monotonic()
    a.lease.release()
    wait_until(lambda: b.took, "b to take the released Lease", timeout=30)
    assert b.took is not None and b.took - released < T.lease / 2
    assert a.lost is None  # a stopped renewing: it was not cut off


def test_a_holder_whose_lease_another_wrote_stops_at_once(
    dev_cluster: devcluster.Cluster, kube_api: Any, namespace: str, candidates: list[Candidate]
) -> None:
    a = Candidate(dev_cluster, namespace, "a")
    candidates.append(a)
    wait_until(lambda: a.took, "a to take the free Lease")
    leases: Any = client.CoordinationV1Api(kube_api)
    lease = leases.read_namespaced_lease(NAME, namespace)
    lease.spec.holder_identity = "someone-else"
    leases.replace_namespaced_lease(NAME, namespace, lease)
    written = time.monotonic()
    wait_until(lambda: a.lost, "a to stop", timeout=30)
    assert a.lost is not None and a.lost - written < T.deadline - T.retry  # not its deadline
