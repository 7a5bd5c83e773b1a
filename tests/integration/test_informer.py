"""The informer on the real control plane: selectors, re-created names, bookmarks,
apiserver restarts mid-watch, a watch whose history was compacted away (410), lists by
watch-list and, on an apiserver without them, in pages.

Nodes here are plain Node objects of the test's own label (no kwok kubelet:
nothing in these tests needs one). Two tests run a second kube-apiserver of
their own, the cluster's apiserver's own command line with its own port and
``--watch-cache=false``, on the cluster's etcd: watches then read etcd's
history directly, so killing it is a restart mid-watch that loses no
history, and compacting etcd while it is down makes the resumed watch answer
410 Gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from lightkube.config.kubeconfig import KubeConfig

from kmodkit.core.nodes import slim_node
from kmodkit.core.runtime.informer import Informer, Lister, kind_lister
from kmodkit.core.runtime.informer_cache import Change
from kmodkit.core.runtime.informer_http import ApiHttp, client_for
from kmodkit_dev import audit, procs
from kmodkit_dev import cluster as devcluster
from kmodkit_dev.operator import token_kubeconfig
from kmodkit_dev.waiting import wait_until

pytestmark = pytest.mark.cluster
LABEL = "kmodkit.io/informer-test"


class Watching:
    """An Informer on nodes, run in an event loop on a thread of its own; the test
    reads its cache and the changes its subscriber was given."""

    def __init__(
        self,
        kubeconfig: Path,
        server: str,
        lister: Callable[[ApiHttp], Lister] | None = None,
        **informer_args: Any,
    ) -> None:
        self.kubeconfig, self.server, self.args = kubeconfig, server, informer_args
        self.lister = lister or kind_lister("", "v1", "nodes")
        self.loop = asyncio.new_event_loop()
        self.changes: list[Change[dict[str, Any]]] = []
        self.informer: Informer[dict[str, Any]] | None = None
        self._api: ApiHttp | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Watching:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *_: object) -> None:
        self._call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(60)

    async def _start(self) -> None:
        conf = yaml.safe_load(self.kubeconfig.read_text())
        for cluster in conf["clusters"]:
            cluster["cluster"]["server"] = self.server
        self._api = client_for(KubeConfig.from_dict(conf, fname=self.kubeconfig))
        self.informer = Informer("watched", self.lister(self._api), view=slim_node, **self.args)
        self.informer.subscribe(self.changes.extend)
        self.informer.start()

    async def _stop(self) -> None:
        assert self.informer is not None and self._api is not None
        await self.informer.stop()
        await self._api.aclose()

    @property
    def it(self) -> Informer[dict[str, Any]]:
        assert self.informer is not None
        return self.informer

    def uids(self) -> dict[str, str]:
        """name -> uid of every node in the cache (read from another thread: a copy)."""
        views = dict(self.it.cache.entries)
        return {k[1]: e.uid for k, e in views.items()}


@pytest.fixture
def tag(kube_api: Any) -> Iterator[str]:
    tag = uuid.uuid4().hex[:8]
    yield tag
    core: Any = client.CoreV1Api(kube_api)
    for node in core.list_node(label_selector=f"{LABEL}={tag}").items:
        core.delete_node(node.metadata.name)


def _node(name: str, tag: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {LABEL: tag, **labels}}}


def _create(kube_api: Any, *nodes: dict[str, Any]) -> dict[str, str]:
    core: Any = client.CoreV1Api(kube_api)
    return {n["metadata"]["name"]: core.create_node(n).metadata.uid for n in nodes}


def _relabel(kube_api: Any, name: str, labels: dict[str, str | None]) -> None:
    client.CoreV1Api(kube_api).patch_node(name, {"metadata": {"labels": labels}})


def _delete(kube_api: Any, name: str) -> None:
    client.CoreV1Api(kube_api).delete_node(name)


def test_a_label_selected_cache_loses_a_node_relabelled_out_and_regains_it(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str
) -> None:
    a, b = f"inf-{tag}-a", f"inf-{tag}-b"
    uids = _create(kube_api, _node(a, tag, pool="in"), _node(b, tag, pool="in"))
    selector = f"{LABEL}={tag},pool=in"
    with Watching(dev_cluster.kubeconfig, dev_cluster.server, label_selector=selector) as w:
        wait_until(lambda: w.uids() == uids, "the selected nodes to be listed")
        _relabel(kube_api, b, {"pool": "out"})
        wait_until(lambda: w.uids() == {a: uids[a]}, "the relabelled node to leave the cache")
        gone = [c for c in w.changes if c.key == ("", b) and c.new is None]
        assert len(gone) == 1 and gone[0].old is not None
        assert gone[0].old["metadata"]["labels"]["pool"] == "in"
        _relabel(kube_api, b, {"pool": "in"})
        wait_until(lambda: w.uids() == uids, "the node relabelled back to return")
        assert w.it.lists == 1, "a selector's DELETED is an event, not a reason to relist"


def test_a_node_deleted_and_recreated_under_its_name_is_the_new_object(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str
) -> None:
    name = f"inf-{tag}-n"
    first = _create(kube_api, _node(name, tag, generation="1"))[name]
    with Watching(dev_cluster.kubeconfig, dev_cluster.server, label_selector=f"{LABEL}={tag}") as w:
        wait_until(lambda: w.uids() == {name: first}, "the node to be listed")
        _delete(kube_api, name)
        second = _create(kube_api, _node(name, tag, generation="2"))[name]
        assert second != first
        wait_until(lambda: w.uids() == {name: second}, "the re-created node in the cache")
        view = w.it.views()[("", name)]
        assert view["metadata"]["labels"]["generation"] == "2"
        uids = [
            (c.old and c.old["metadata"]["uid"], c.new and c.new["metadata"]["uid"])
            for c in w.changes
            if c.key == ("", name)
        ]
        # Listed, deleted (the old uid), added (the new one): never one object changing
        # uid. (The node controller's own updates of each object come in between.)
        assert [u for u in uids if u[0] != u[1]] == [(None, first), (first, None), (None, second)]


def test_bookmarks_advance_the_resource_version_without_events(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str
) -> None:
    busy = f"inf-{tag}-busy"
    _create(kube_api, _node(busy, tag, pool="busy"))
    # A selection nothing is in: no event ever comes, only bookmarks can move it on.
    selector = f"{LABEL}={tag},pool=none"
    # A short server-side timeout: the apiserver bookmarks a watch just before it ends it.
    with Watching(
        dev_cluster.kubeconfig, dev_cluster.server, label_selector=selector, watch_timeout=5
    ) as w:
        wait_until(lambda: w.it.synced.is_set(), "the (empty) list")
        listed_at = w.it.cache.resource_version
        for i in range(3):
            _relabel(kube_api, busy, {"step": str(i)})  # outside the selection: no event
        wait_until(
            lambda: w.it.cache.resource_version != listed_at,
            "a bookmark to move the resourceVersion on",
            timeout=30,
        )
        assert w.changes == [] and w.uids() == {}
        assert w.it.lists == 1


@pytest.fixture
def solo_apiserver(dev_cluster: devcluster.Cluster, tmp_path: Path) -> Iterator[SoloApiserver]:
    solo = SoloApiserver(dev_cluster, tmp_path)
    solo.start()
    try:
        yield solo
    finally:
        solo.stop()


class SoloApiserver:
    """A second kube-apiserver on the cluster's etcd: the cluster's apiserver's own
    command line, with a port and audit log of its own, the watch cache off and any
    ``extra`` flags."""

    def __init__(
        self, cluster: devcluster.Cluster, workdir: Path, extra: tuple[str, ...] = ()
    ) -> None:
        self.cluster = cluster
        self.port = procs.free_port()
        self.log = workdir / "solo-apiserver.log"
        cmdline = Path(f"/proc/{cluster.pids['kube-apiserver']}/cmdline").read_bytes()
        argv = [a.decode() for a in cmdline.split(b"\0") if a]
        self.binary = argv[0]
        replaced = {"--secure-port": str(self.port), "--audit-log-path": str(workdir / "audit")}
        self.argv = [
            f"{a.split('=', 1)[0]}={replaced[a.split('=', 1)[0]]}"
            if a.split("=", 1)[0] in replaced
            else a
            for a in argv
        ] + [
            "--watch-cache=false",
            # The cluster's own apiserver alone keeps the "kubernetes" Service's endpoints.
            "--endpoint-reconciler-type=none",
            *extra,
        ]
        self.pid = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.pid = procs.spawn(self.argv, self.log)
        ca = str(self.cluster.pki / "ca.crt")

        def ready() -> bool:
            try:
                ctx = ssl.create_default_context(cafile=ca)
                with urllib.request.urlopen(f"{self.server}/readyz", timeout=2, context=ctx) as r:
                    return bool(r.read().strip() == b"ok")
            except OSError:
                assert procs.runs(self.pid, self.binary), self.log.read_text()[-3000:]
                return False

        wait_until(ready, "the solo apiserver to be ready", timeout=120)

    def kill(self) -> None:
        """SIGKILL, as a crash would; its watches end without a word."""
        os.kill(self.pid, signal.SIGKILL)
        while procs.runs(self.pid, self.binary) and not procs.is_zombie(self.pid):
            time.sleep(0.05)
        procs.reap(self.pid)
        procs.wait_port_free(self.port)

    def stop(self) -> None:
        procs.stop(self.pid, self.binary)


def _etcd(cluster: devcluster.Cluster, call: str, body: dict[str, Any]) -> Any:
    """etcd's gRPC gateway (JSON over HTTP) on its loopback client URL."""
    url = f"http://127.0.0.1:{cluster.ports['etcd']}/v3/{call}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def _compact_etcd(cluster: devcluster.Cluster) -> int:
    """Compact etcd's history up to its current revision; returns that revision."""
    key = base64.b64encode(b"/registry/").decode()
    revision = int(_etcd(cluster, "kv/range", {"key": key, "limit": 1})["header"]["revision"])
    _etcd(cluster, "kv/compaction", {"revision": revision, "physical": True})
    return revision


def test_an_apiserver_restart_mid_watch_resumes_without_a_relist(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str, solo_apiserver: SoloApiserver
) -> None:
    a, b, c = (f"inf-{tag}-{x}" for x in "abc")
    uids = _create(kube_api, _node(a, tag), _node(b, tag))
    selector = f"{LABEL}={tag}"
    with Watching(
        dev_cluster.kubeconfig, solo_apiserver.server, label_selector=selector, backoff=(0.2, 1.0)
    ) as w:
        wait_until(lambda: w.uids() == uids, "the nodes to be listed")
        solo_apiserver.kill()
        # While its apiserver is away the informer serves what it had, still synced.
        _delete(kube_api, b)
        uids |= _create(kube_api, _node(c, tag))
        _relabel(kube_api, a, {"moved": "yes"})
        assert w.it.synced.is_set() and set(w.uids()) == {a, b}
        solo_apiserver.start()
        wait_until(lambda: w.uids() == {a: uids[a], c: uids[c]}, "the missed changes")
        wait_until(
            lambda: w.it.views()[("", a)]["metadata"]["labels"].get("moved") == "yes",
            "the relabel made while the apiserver was away",
        )
        assert w.it.lists == 1, "the watch resumed from its resourceVersion: nothing to relist"
        assert ("", b) in [ch.key for ch in w.changes if ch.new is None]


def test_history_compacted_while_the_watch_was_down_makes_a_410_and_a_relist(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str, solo_apiserver: SoloApiserver
) -> None:
    a, b, c = (f"inf-{tag}-{x}" for x in "abc")
    uids = _create(kube_api, _node(a, tag), _node(b, tag))
    selector = f"{LABEL}={tag}"
    with Watching(
        dev_cluster.kubeconfig, solo_apiserver.server, label_selector=selector, backoff=(0.2, 1.0)
    ) as w:
        wait_until(lambda: w.uids() == uids, "the nodes to be listed")
        solo_apiserver.kill()
        _delete(kube_api, b)
        uids |= _create(kube_api, _node(c, tag))
        compacted = _compact_etcd(dev_cluster)
        assert int(w.it.cache.resource_version) < compacted
        solo_apiserver.start()
        wait_until(lambda: w.it.lists == 2, "a relist after the 410")
        # The relist replaced the cache: the delete no watch delivered is seen.
        assert w.uids() == {a: uids[a], c: uids[c]}
        assert ("", b) in [ch.key for ch in w.changes if ch.new is None]
        assert int(w.it.cache.resource_version) >= compacted


def test_a_kind_named_by_its_resource_is_listed_in_every_namespace_by_selector(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str
) -> None:
    """A backend's watch (``kind_lister``): the core group's path, every namespace, and the
    selector applied by the apiserver."""
    core: Any = client.CoreV1Api(kube_api)
    spaces = [f"inf-{tag}-{i}" for i in range(2)]
    for ns in spaces:
        core.create_namespace({"metadata": {"name": ns}})
    try:
        for ns in spaces:
            for name, pool in (("in", tag), ("out", "other")):
                core.create_namespaced_config_map(
                    ns, {"metadata": {"name": name, "labels": {LABEL: pool}}}
                )
        lister = kind_lister("", "v1", "configmaps")
        with Watching(
            dev_cluster.kubeconfig, dev_cluster.server, lister, label_selector=f"{LABEL}={tag}"
        ) as w:
            wait_until(lambda: set(w.it.views()) == {(ns, "in") for ns in spaces}, "listed")
            core.patch_namespaced_config_map(
                "out", spaces[0], {"metadata": {"labels": {LABEL: tag}}}
            )
            wait_until(lambda: (spaces[0], "out") in w.it.views(), "the relabelled one watched")
            assert w.it.lists == 1
    finally:
        for ns in spaces:
            core.delete_namespace(ns)


def test_a_kind_not_served_is_none_until_it_is_then_it_is_watched(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str
) -> None:
    """A watched CRD not installed (404) is an empty, synced cache, so the operator's passes
    are not held; it is looked for again and filled once the CRD is there."""
    with _unserved(dev_cluster, kube_api, f"t{tag}.kmodkit.test", (0.2, 1.0)) as (w, serve):
        assert w.it.views() == {}
        serve()
        wait_until(lambda: ("", "g1") in w.it.views(), "the new kind's object watched")


@contextlib.contextmanager
def _unserved(
    dev_cluster: devcluster.Cluster, kube_api: Any, group: str, backoff: tuple[float, float]
) -> Iterator[tuple[Watching, Callable[[], None]]]:
    """An informer of kind Gadget in ``group`` started before its CRD exists (and synced),
    and a call that installs the CRD and creates Gadget g1 once it is served; the CRD is
    removed at the end."""
    plural = "gadgets"
    ext: Any = client.ApiextensionsV1Api(kube_api)
    objs: Any = client.CustomObjectsApi(kube_api)
    lister = kind_lister(group, "v1", plural)
    installed = False

    def serve() -> None:
        nonlocal installed
        ext.create_custom_resource_definition(_gadgets(group, plural))
        installed = True
        body = {"apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": "g1"}}
        wait_until(lambda: _created(objs, group, plural, body), "the CRD served", timeout=30)

    with Watching(dev_cluster.kubeconfig, dev_cluster.server, lister, backoff=backoff) as w:
        wait_until(w.it.synced.is_set, "an unserved kind to count as synced")
        try:
            yield w, serve
        finally:
            if installed:
                ext.delete_custom_resource_definition(f"{plural}.{group}")


def _gadgets(group: str, plural: str) -> dict[str, Any]:
    """A cluster-scoped CRD of ``group``, kind Gadget."""
    return {
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": plural, "singular": "gadget", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }


def _created(objs: Any, group: str, plural: str, body: dict[str, Any]) -> bool:
    try:
        objs.create_cluster_custom_object(group, "v1", plural, body)
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def test_a_kind_served_since_is_looked_for_at_once_when_asked(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str
) -> None:
    """An informer waiting out a long backoff for a kind not served yet lists it as soon as it
    is told to look again, as the operator does on every CRD event."""
    with _unserved(dev_cluster, kube_api, f"a{tag}.kmodkit.test", (600, 600)) as (w, serve):
        serve()
        assert ("", "g1") not in w.it.views()  # the next try is 600 s away
        w.loop.call_soon_threadsafe(w.it.look_again)
        wait_until(lambda: ("", "g1") in w.it.views(), "the kind listed", timeout=10)


def test_a_kind_it_may_not_list_is_none_if_not_served_and_never_synced_if_served(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The apiserver authorizes before it routes: a client without list on a kind it does not
    serve is answered 403, not 404. Such a kind has none (synced, as a 404 would make it: the
    informer asks discovery first); a served kind the client may not list is never taken for
    empty: its cache stays unsynced."""
    account = "bare"
    core: Any = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    token = token_kubeconfig(dev_cluster.kubeconfig, namespace, account, kube_api, tmp_path / "kc")
    absent = kind_lister(f"n{uuid.uuid4().hex[:8]}.kmodkit.test", "v1", "gadgets")
    with Watching(token, dev_cluster.server, absent, backoff=(0.2, 1.0)) as w:
        wait_until(w.it.synced.is_set, "a kind neither served nor ours to list to count as none")
        assert w.it.views() == {}
    caplog.set_level(logging.WARNING, logger="kmodkit.informer")
    nodes = kind_lister("", "v1", "nodes")
    with Watching(token, dev_cluster.server, nodes, backoff=(0.2, 1.0)) as w:
        wait_until(lambda: "lacks list and watch" in caplog.text, "the forbidden list said")
        assert not w.it.synced.is_set()


@pytest.fixture
def node_reader(
    dev_cluster: devcluster.Cluster, kube_api: Any, namespace: str, tmp_path: Path
) -> Iterator[tuple[Path, str]]:
    """A ServiceAccount that may list and watch nodes (the audit log records service
    accounts): its kubeconfig and its user name."""
    core: Any = client.CoreV1Api(kube_api)
    rbac: Any = client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    name = f"inf-reader-{namespace}"
    rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": "reader", "namespace": namespace}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    rbac.create_cluster_role_binding(
        {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
    )
    try:
        kc = token_kubeconfig(
            dev_cluster.kubeconfig, namespace, "reader", kube_api, tmp_path / "kc"
        )
        yield kc, f"system:serviceaccount:{namespace}:reader"
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_a_list_is_one_watch_streaming_every_object_that_goes_on_as_the_watch(
    dev_cluster: devcluster.Cluster, kube_api: Any, tag: str, node_reader: tuple[Path, str]
) -> None:
    """The apiserver serves watch-lists: the informer's list is a watch whose initial
    events land whole (a list, by the count) and which then delivers later changes; the
    audit log shows that one request and no list."""
    kubeconfig, user = node_reader
    a, b, c = (f"inf-{tag}-{x}" for x in "abc")
    uids = _create(kube_api, _node(a, tag), _node(b, tag))
    with Watching(kubeconfig, dev_cluster.server, label_selector=f"{LABEL}={tag}") as w:
        wait_until(lambda: w.uids() == uids, "the nodes to be listed")
        assert w.it.lists == 1 and w.it.watch_lists
        # Both arrived in one delivery, as a list's difference does.
        assert sorted(ch.key for ch in w.changes[:2]) == [("", a), ("", b)]
        uids |= _create(kube_api, _node(c, tag))
        wait_until(lambda: w.uids() == uids, "a node created after the list")
        assert w.it.lists == 1
    requests = [
        (r["verb"], r["requestURI"])
        for r in audit.requests(dev_cluster.log("audit"), user)
        if (r.get("objectRef") or {}).get("resource") == "nodes"  # discovery's GETs have none
    ]
    assert len(requests) == 1, requests
    verb, uri = requests[0]
    assert verb == "watch" and "sendinitialevents=true" in uri.lower(), requests


@pytest.fixture
def solo_without_watch_lists(
    dev_cluster: devcluster.Cluster, tmp_path: Path
) -> Iterator[SoloApiserver]:
    solo = SoloApiserver(dev_cluster, tmp_path, ("--feature-gates=WatchList=false",))
    solo.start()
    try:
        yield solo
    finally:
        solo.stop()


def test_an_apiserver_without_watch_lists_is_listed_in_pages(
    dev_cluster: devcluster.Cluster,
    kube_api: Any,
    tag: str,
    solo_without_watch_lists: SoloApiserver,
) -> None:
    """An apiserver that refuses the watch-list (here one with its WatchList feature off,
    as before Kubernetes 1.32) is listed in pages, two a page here, and then watched."""
    names = [f"inf-{tag}-{i}" for i in range(5)]
    uids = _create(kube_api, *(_node(n, tag) for n in names))
    with Watching(
        dev_cluster.kubeconfig,
        solo_without_watch_lists.server,
        label_selector=f"{LABEL}={tag}",
        page=2,
    ) as w:
        wait_until(lambda: w.uids() == uids, "the nodes to be listed")
        assert not w.it.watch_lists and w.it.lists == 1
        late = f"inf-{tag}-late"
        uids |= _create(kube_api, _node(late, tag))
        wait_until(lambda: w.uids() == uids, "a node created after the list")
        assert w.it.lists == 1
