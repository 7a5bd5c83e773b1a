"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, as local processes.

Everything a cluster needs (certificates, data, logs, kubeconfig, the pids and
ports) lives in one state directory per cluster name, so ``down`` can stop
exactly what ``up`` started, and a test run and the demo can coexist.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import ssl
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kmodkit_dev import build, pki, procs, realnode
from kmodkit_dev.nodes import KWOK_ANNOTATION, fleet
from kmodkit_dev.versions import CONTROL_PLANE

Echo = Callable[[str], None]
STAGES = Path(__file__).parent / "kwok" / "stages.yaml"
AUDIT_POLICY = Path(__file__).parent / "audit-policy.yaml"
NODE_LEASE_SECONDS = 1200
"""kwok renews each node's Lease every quarter of this (5 minutes), as a kubelet renews its
own: at 10 s (a kubelet's default 40 s lease) 10,000 nodes are 1,000 writes a second, more
than the whole two-core machine the simulated fleet shares with what it measures."""
NODE_GRACE = "1h"
"""How long the controller-manager waits for a renewal before it marks a node NotReady:
several renewals, however late kwok is under load."""
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Processes in start order; stopped in reverse.
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ClusterError(RuntimeError):
    """The cluster could not start; the message names the component and its log."""


@dataclass
class Cluster:
    name: str
    dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    def log(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def save(self) -> None:
        data = asdict(self) | {"dir": str(self.dir)}
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        tmp.rename(self.dir / "state.json")

    def running(self) -> dict[str, bool]:
        return {c: procs.runs(pid, c) for c, pid in self.pids.items()}


def state_root() -> Path:
    env = os.environ.get("KMODKIT_STATE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "kmodkit" / "devcluster"


def load(name: str) -> Cluster | None:
    f = state_root() / name / "state.json"
    if not f.exists():
        return None
    data = json.loads(f.read_text())
    return Cluster(name=data["name"], dir=Path(data["dir"]), ports=data["ports"], pids=data["pids"])


def _say(msg: str) -> None:
    print(msg, flush=True)


def up(
    name: str = "default",
    nodes: int = 6,
    profile: str = "mixed",
    echo: Echo = _say,
    real_node: bool = False,
) -> Cluster:
    """Start a cluster (building binaries on first use) and create ``nodes`` kwok nodes;
    with ``real_node``, also a real kubelet in a VM and a registry it pulls from
    (``kmodkit_dev.realnode``)."""
    build.ensure(CONTROL_PLANE, echo)
    existing = load(name)
    if existing and all(existing.running().values()):
        echo(f"devcluster {name!r} already runs at {existing.server}")
        return existing
    if existing:
        down(name, echo=lambda _m: None)
    d = state_root() / name
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    cluster = Cluster(name=name, dir=d)
    token = secrets.token_urlsafe(32)
    pki.make_pki(cluster.pki, token)
    if real_node:
        realnode.add_service_names(cluster.pki)
    _write_kubeconfig(cluster, token)
    try:
        _start(cluster, echo)
        if nodes:
            add_nodes(cluster, fleet(nodes, profile), echo)
        if real_node:
            _add_real_node(cluster, echo)
    except BaseException:
        down(name, echo=lambda _m: None)
        raise
    echo(f"devcluster {name!r} is up: export KUBECONFIG={cluster.kubeconfig}")
    return cluster


def _add_real_node(cluster: Cluster, echo: Echo) -> None:
    def started(component: str, pid: int) -> None:
        # Recorded as soon as it runs, so down() stops it whatever happens next.
        cluster.pids[component] = pid
        cluster.save()

    realnode.start(
        cluster.dir, cluster.pki, cluster.ports["kube-apiserver"], cluster.kubeconfig, echo, started
    )


def down(name: str = "default", echo: Echo = _say) -> None:
    """Stop every process the cluster started and remove its state."""
    cluster = load(name)
    if cluster is None:
        d = state_root() / name
        if d.exists():
            shutil.rmtree(d, ignore_errors=True)
        echo(f"devcluster {name!r} is not running")
        return
    # Reverse start order; processes added later (the demo's registry) go first.
    for component, pid in reversed(list(cluster.pids.items())):
        procs.stop(pid, component)
    shutil.rmtree(cluster.dir, ignore_errors=True)
    echo(f"devcluster {name!r} stopped")


def _write_kubeconfig(cluster: Cluster, token: str) -> None:
    ca = cluster.pki / "ca.crt"
    cluster.ports = {c: procs.free_port() for c in ORDER} | {"etcd-peer": procs.free_port()}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster.name,
                "cluster": {"server": cluster.server, "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": cluster.name, "context": {"cluster": cluster.name, "user": "admin"}}],
        "current-context": cluster.name,
    }
    cluster.kubeconfig.write_text(json.dumps(cfg, indent=2))
    cluster.kubeconfig.chmod(0o600)


def _argv(cluster: Cluster, component: str) -> list[str]:
    p, pk, kc = cluster.ports, cluster.pki, str(cluster.kubeconfig)
    bin_ = str(build.binary(component))
    serving = [
        f"--tls-cert-file={pk / 'serving.crt'}",
        f"--tls-private-key-file={pk / 'serving.key'}",
    ]
    health_open = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
    if component == "etcd":
        peer = f"http://127.0.0.1:{p['etcd-peer']}"
        client = f"http://127.0.0.1:{p['etcd']}"
        return [
            bin_,
            "--name=default",
            f"--data-dir={cluster.dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
    if component == "kube-apiserver":
        return [
            bin_,
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['kube-apiserver']}",
            *serving,
            f"--client-ca-file={pk / 'ca.crt'}",
            f"--token-auth-file={pk / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pk / 'sa.key'}",
            f"--service-account-signing-key-file={pk / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # Requests by service accounts, for tests that prove which permissions the
            # operator's RBAC grants and which it really uses (tests/integration/test_rbac.py).
            f"--audit-policy-file={AUDIT_POLICY}",
            f"--audit-log-path={cluster.log('audit')}",
            # One file, never rotated (the default rotates at 100 MB): the benchmark counts a
            # 10,000-node rollout's writes from it, over 100 MB of records.
            "--audit-log-maxsize=100000",
        ]
    if component == "kube-controller-manager":
        return [
            bin_,
            f"--kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p[component]}",
            *serving,
            health_open,
            f"--root-ca-file={pk / 'ca.crt'}",
            f"--service-account-private-key-file={pk / 'sa.key'}",
            "--use-service-account-credentials=true",
            # kwok plays thousands of kubelets on two cores; under load its lease renewals
            # lag by minutes (a 10,000-node benchmark run: past 5 minutes), the node is
            # marked NotReady, and so are its pods, which kwok never marks Ready again. A
            # node taken down on purpose (nodes.set_down) is marked NotReady at once, not
            # by this.
            f"--node-monitor-grace-period={NODE_GRACE}",
            # Its controllers' client allows 20 requests a second by default: the DaemonSet
            # controller made a 1,000-node fleet's pods in 50 s, and the Job controller's
            # flash Jobs for 10,000 nodes would take most of an hour. Large clusters raise
            # it; this is the setting of Kubernetes' own 5,000-node scale tests.
            "--kube-api-qps=100",
            "--kube-api-burst=100",
        ]
    if component == "kube-scheduler":
        return [
            bin_,
            f"--kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p[component]}",
            *serving,
            health_open,
        ]
    if component == "kwok":
        return [
            bin_,
            f"--kubeconfig={kc}",
            f"--config={STAGES}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--node-ip=127.0.0.1",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            "--cidr=10.0.0.0/16",
            f"--server-address=127.0.0.1:{p['kwok']}",
            *serving,
        ]
    raise KeyError(component)


def _spawn(cluster: Cluster, component: str) -> None:
    env = dict(os.environ)
    if component == "kwok":
        # kwok reads ~/.kwok/kwok.yaml when present; keep a user's file out.
        env["HOME"] = str(cluster.dir)
    cluster.pids[component] = procs.spawn(_argv(cluster, component), cluster.log(component), env)
    cluster.save()


def _start(cluster: Cluster, echo: Echo) -> None:
    for component in ORDER:
        _spawn(cluster, component)
        started = time.monotonic()
        _wait_ready(cluster, component)
        echo(f"devcluster:   {component} ready ({time.monotonic() - started:.1f}s)")


def restart(cluster: Cluster, component: str, echo: Echo = _say) -> float:
    """Kill one component (SIGKILL, as a crash would) and start it again; returns how long
    it was away. The others keep running and reconnect on their own."""
    binary = str(build.binary(component))
    started = time.monotonic()
    pid = cluster.pids[component]
    if procs.runs(pid, binary):
        os.kill(pid, signal.SIGKILL)
        # Gone only once its sockets are: /proc/<pid> outlives the exe link while it exits.
        while Path(f"/proc/{pid}").exists() and not procs.is_zombie(pid):
            time.sleep(0.05)
        procs.reap(pid)
    procs.wait_port_free(cluster.ports[component])
    _spawn(cluster, component)
    _wait_ready(cluster, component)
    away = time.monotonic() - started
    echo(f"devcluster:   {component} restarted ({away:.1f}s)")
    return away


def _ssl_context(cluster: Cluster) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))


def _get(url: str, ctx: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
        return str(r.read().decode())


def _ready_probe(cluster: Cluster, component: str) -> bool:
    p = cluster.ports
    try:
        if component == "etcd":
            return '"health":"true"' in _get(f"http://127.0.0.1:{p['etcd']}/health")
        path = "readyz" if component == "kube-apiserver" else "healthz"
        return (
            _get(f"https://127.0.0.1:{p[component]}/{path}", _ssl_context(cluster)).strip() == "ok"
        )
    except OSError:
        return False


def _wait_ready(cluster: Cluster, component: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    pid = cluster.pids[component]
    while time.monotonic() < deadline:
        if not procs.runs(pid, component):
            raise ClusterError(
                f"{component} exited during start-up; last lines of "
                f"{cluster.log(component)}:\n{_tail(cluster.log(component))}"
            )
        if _ready_probe(cluster, component):
            return
        time.sleep(0.2)
    raise ClusterError(
        f"{component} did not become ready in {timeout:.0f}s; see "
        f"{cluster.log(component)}:\n{_tail(cluster.log(component))}"
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def api_client(cluster: Cluster) -> Any:
    from kubernetes import config

    untyped: Any = config
    return untyped.new_client_from_config(config_file=str(cluster.kubeconfig))


def add_nodes(
    cluster: Cluster, manifests: list[dict[str, Any]], echo: Echo = _say, timeout: float = 300.0
) -> None:
    """Create kwok nodes and wait until every one is Ready and untainted.

    The apiserver gives each new node the ``node.kubernetes.io/not-ready`` taint, which the
    controller-manager takes off once the node is Ready: at once in a normal cluster, but
    here, with thousands of nodes created in a minute on two cores, over the best part of
    an hour, each removal a change to the node. So it is taken off here, as soon as kwok
    marks the node Ready, and a test or benchmark starts on a fleet at rest.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api: Any = client.CoreV1Api(api_client(cluster))
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(api.create_node, manifests))
    names = {m["metadata"]["name"] for m in manifests}
    deadline = time.monotonic() + timeout

    def untaint(node: Any) -> None:
        kept = [t.to_dict() for t in node.spec.taints or [] if t.key != NOT_READY_TAINT]
        rv = node.metadata.resource_version
        body = {"metadata": {"resourceVersion": rv}, "spec": {"taints": kept or None}}
        try:
            api.patch_node(node.metadata.name, body)
        except ApiException as err:
            if err.status != 409:  # changed since: looked at again on the next round
                raise

    while True:
        listed = [
            n for n in api.list_node(label_selector="type=kwok").items if n.metadata.name in names
        ]
        ready = [
            n
            for n in listed
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        ]
        tainted = [n for n in ready if any(t.key == NOT_READY_TAINT for t in n.spec.taints or [])]
        if tainted:
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(untaint, tainted))
        if len(ready) == len(names) and not tainted:
            echo(f"devcluster:   {len(names)} kwok nodes Ready")
            return
        if time.monotonic() > deadline:
            missing = sorted(names - {n.metadata.name for n in ready})
            raise ClusterError(
                f"{len(missing)} kwok nodes not Ready after {timeout:.0f}s "
                f"(e.g. {', '.join(missing[:5])}); see {cluster.log('kwok')}"
            )
        time.sleep(0.5)
