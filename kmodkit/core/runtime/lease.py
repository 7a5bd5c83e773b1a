"""One active replica: a coordination.k8s.io Lease, taken, renewed and released.

The rules are in ``kmodkit.core.election``. Every write to the Lease is a
compare-and-swap on its resourceVersion (an update), or a create that only one
candidate can win, so two candidates never both take it. The holder renews from a
thread of its own, apart from the operator's event loop and its passes, and when
no renewal has landed for the deadline it ends the process at once: every piece
of progress is in the cluster, and a process that ends writes nothing more, where
one that only stopped some of its tasks might.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kmodkit.core.election import TIMING, Seen, Timing, may_take, must_stop, observe
from kmodkit.core.runtime.kube import api_message

log = logging.getLogger("kmodkit.lease")


def identity() -> str:
    """This process's name in the Lease: its pod (or host) and a suffix of its own, so a
    restarted container is a new candidate that waits like any other."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Lease:
    def __init__(
        self,
        api: Any,
        namespace: str,
        name: str,
        me: str,
        timing: Timing = TIMING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._leases: Any = client.CoordinationV1Api(api)  # its methods have no useful types
        self.namespace, self.name, self.me = namespace, name, me
        self.timing = timing
        self._clock = clock
        self._held: Any = None
        """The record as our last landed write left it."""
        self._renewed = 0.0
        """When the last landed renewal was sent (our clock)."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __str__(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        seen: Seen | None = None
        said = ""
        while True:
            try:
                seen = self._try(seen)
                if seen is None:
                    log.info("holding %s as %s", self, self.me)
                    return
                if seen.holder != said:
                    said = seen.holder
                    log.info("waiting: %s is held by %s", self, said)
            except Exception as err:  # an error answer, a refused or dropped connection
                log.warning("%s: %s", self, api_message(err))
            time.sleep(self.timing.retry)

    def _try(self, seen: Seen | None) -> Seen | None:
        """One try to take the Lease: None once it is ours, else what was seen."""
        sent = self._clock()
        try:
            lease = self._read()
        except ApiException as err:
            if err.status != 404:
                raise
            now = _now()
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(acquired=now, renewed=now, transitions=0),
            )
            self._landed(
                self._leases.create_namespaced_lease(self.namespace, body, **self._t), sent
            )
            return None
        spec = lease.spec or client.V1LeaseSpec()
        # Seen when the answer came, not when asked: a renewal may land while the read is
        # on its way, and the wait must count from no earlier than that.
        read = self._clock()
        seen = observe(seen, spec.holder_identity or "", lease.metadata.resource_version, read)
        if not may_take(seen, self.me, read, self.timing):
            return seen
        now = _now()
        transitions = spec.lease_transitions or 0
        lease.spec = self._spec(acquired=now, renewed=now, transitions=transitions + 1)
        self._landed(self._replace(lease), sent)
        return None

    @property
    def _t(self) -> dict[str, float]:
        return {"_request_timeout": self.timing.retry}

    def _read(self) -> Any:
        return self._leases.read_namespaced_lease(self.name, self.namespace, **self._t)

    def _replace(self, lease: Any) -> Any:
        return self._leases.replace_namespaced_lease(self.name, self.namespace, lease, **self._t)

    def _spec(
        self,
        acquired: datetime.datetime | None,
        renewed: datetime.datetime,
        transitions: int,
        holder: str | None = None,
    ) -> Any:
        return client.V1LeaseSpec(
            holder_identity=self.me if holder is None else holder,
            lease_duration_seconds=int(self.timing.lease),
            acquire_time=acquired,
            renew_time=renewed,
            lease_transitions=transitions,
        )

    def _landed(self, lease: Any, sent: float) -> None:
        self._held, self._renewed = lease, sent

    def renew(self) -> bool:
        """One renewal, a compare-and-swap on the record we last wrote. False when the
        Lease is someone else's: this process must stop at once."""
        sent = self._clock()
        spec = self._held.spec
        lease = client.V1Lease(
            metadata=self._held.metadata,
            spec=self._spec(spec.acquire_time, _now(), spec.lease_transitions or 0),
        )
        try:
            self._landed(self._replace(lease), sent)
        except ApiException as err:
            log.warning("renewing %s: %s", self, api_message(err))
            if err.status == 409:  # another write came between: whose?
                return self._still_ours()
        except Exception as err:
            log.warning("renewing %s: %s", self, api_message(err))
        return True

    def _still_ours(self) -> bool:
        try:
            lease = self._read()
        except Exception as err:
            log.warning("reading %s: %s", self, api_message(err))
            return True  # unknown: the deadline decides
        if (lease.spec and lease.spec.holder_identity) != self.me:
            log.error("%s was taken by %s", self, lease.spec and lease.spec.holder_identity)
            return False
        self._held = lease  # ours under a newer version: the next renewal starts from it
        return True

    def hold(self, lost: Callable[[], None]) -> None:
        """Renew from a thread until ``release``, and fence from another: call ``lost``
        (which must end the process) once no renewal has landed for the deadline, however
        long a renewal blocks, or at once when the Lease is another's."""

        def renew() -> None:
            while not self._stop.is_set():
                started = self._clock()
                if not self.renew():
                    self._stop.set()
                    lost()
                    return
                self._stop.wait(max(0.0, self.timing.retry - (self._clock() - started)))

        def fence() -> None:
            while not self._stop.wait(self.timing.retry / 4):
                if must_stop(self._renewed, self._clock(), self.timing):
                    log.error("%s not renewed for %.0fs: stopping", self, self.timing.deadline)
                    self._stop.set()
                    lost()
                    return

        self._threads = [
            threading.Thread(target=renew, name="lease-renew", daemon=True),
            threading.Thread(target=fence, name="lease-fence", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def release(self) -> None:
        """Stop renewing and hand the Lease back, so the next replica takes it at once."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timing.retry * 2)
        if self._held is None:
            return
        spec = self._held.spec
        lease = client.V1Lease(
            metadata=self._held.metadata,
            spec=self._spec(None, _now(), spec.lease_transitions or 0, holder=""),
        )
        try:
            self._replace(lease)
            log.info("released %s", self)
        except Exception as err:  # it expires on its own
            log.warning("releasing %s: %s", self, api_message(err))
