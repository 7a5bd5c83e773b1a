"""A CRD created or deleted while the operator runs: the served groups follow it, the loops
wake when they moved, and every informer looks again for its kind at once.

The Kube and the informers here are stand-ins: ``NoKube`` that nothing may call, and
``Waiting`` informers that only record being told to look again (the real informer's
``look_again`` is tested on the real apiserver in tests/integration/test_informer.py).
"""

from __future__ import annotations

from types import SimpleNamespace as O
from typing import Any

import kopf
import pytest

from kmodkit.core.runtime import watch_cache
from kmodkit.core.runtime.watch_cache import Shared


class NoKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube that nothing may call."""


class Waiting:
    """Stand-in for an Informer waiting out its backoff: counts the calls to look again."""

    def __init__(self) -> None:
        self.asked = 0

    def look_again(self) -> None:
        self.asked += 1


def _shared(*informers: Any) -> Shared:
    shared = Shared(kube=NoKube(), operator_namespace="kmodkit-system")  # type: ignore[arg-type]
    shared.informers = list(informers)
    return shared


def test_a_new_crd_serves_its_group_wakes_the_loops_and_every_informer_looks_again() -> None:
    a, b = Waiting(), Waiting()
    shared = _shared(a, b)
    woken = shared.wakeups.event("loop")
    shared.crd_changed("modules.kmm.sigs.x-k8s.io", "kmm.sigs.x-k8s.io")
    assert "kmm.sigs.x-k8s.io" in shared.api_groups
    assert woken.is_set()
    assert (a.asked, b.asked) == (1, 1)


def test_an_established_crd_changes_no_group_and_wakes_no_loop_but_informers_look_again() -> None:
    a = Waiting()
    shared = _shared(a)
    shared.crd_changed("modules.kmm.sigs.x-k8s.io", "kmm.sigs.x-k8s.io")
    woken = shared.wakeups.event("loop")
    # The same CRD again (its status now says Established): the kind may be served only now.
    shared.crd_changed("modules.kmm.sigs.x-k8s.io", "kmm.sigs.x-k8s.io")
    assert not woken.is_set()
    assert a.asked == 2


def test_a_deleted_crd_takes_its_group_away_and_wakes_the_loops() -> None:
    shared = _shared(Waiting())
    shared.crd_changed("modules.kmm.sigs.x-k8s.io", "kmm.sigs.x-k8s.io")
    woken = shared.wakeups.event("loop")
    shared.crd_changed("modules.kmm.sigs.x-k8s.io", None)
    assert "kmm.sigs.x-k8s.io" not in shared.api_groups
    assert woken.is_set()


def test_the_crd_groups_are_known_when_the_start_up_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the CRD watch's first events: a first pass must not take a group a CRD serves
    (upstream KMM's, say) for one not served. The API is a stand-in answering two lists."""
    groups = O(groups=[O(name="apps"), O(name="kmodkit.io")])
    crds = O(items=[O(metadata=O(name="modules.kmodkit.io"), spec=O(group="kmodkit.io"))])
    monkeypatch.setattr(watch_cache.client, "ApisApi", lambda _: O(get_api_versions=lambda: groups))
    monkeypatch.setattr(
        watch_cache.client,
        "ApiextensionsV1Api",
        lambda _: O(list_custom_resource_definition=lambda: crds),
    )
    shared = Shared(kube=O(api=None), operator_namespace="ns")  # type: ignore[arg-type]
    registry = kopf.OperatorRegistry()
    shared.register(registry)
    (startup,) = [h for h in registry._activities.get_all_handlers() if "discover" in h.id]
    startup.fn()
    assert shared.api_groups == {"apps", "kmodkit.io"}
    assert shared.builtin_groups == {"apps"}
