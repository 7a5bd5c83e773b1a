"""Kill the real operator at any moment, break what it talks to, and lose nothing.

The operator is ``kmodkit run``, the command the chart runs, with every
built-in backend, on its own control plane (etcd, kube-apiserver,
controller-manager, scheduler, kwok) and a real OCI registry. Between the
operator and the apiserver sits a loopback fault proxy (``faults.py``); between
the operator and the registry, a front that can fail (``registry_fronts``). The
harness's own watches go straight to the apiserver (``invariants.py``).

Stand-ins, because nothing runs inside a kwok pod: ``FakeBuilder`` plays the
Tenstorrent builder's node side (it labels the node with the tt-kmd it would
have loaded), and kwok completes flash Job pods and makes loader pods Ready.

The run, with a seed that is printed and settable (``KMODKIT_CHAOS_SEED``):

1. Both Modules load and the driver policy installs, unharmed.
2. The storm (one replica, as with ``controller.replicas=1``): the Module's image
   changes, the driver is bumped and the firmware policy arrives; then at least
   ``KMODKIT_CHAOS_KILLS`` (50) SIGKILLs, most at a random moment of the
   operator's life (start-up included), every fifth at a chosen point (right
   after a cordon write, mid-eviction, after a swap but before the node's state
   is written, the first write after a start). Meanwhile the proxy throttles
   (429), conflicts (409), expires (410) and drops watches; the apiserver is
   killed and restarted; the registry answers 5xx, stalls, and refuses a wrong
   password; a node goes NotReady and comes back. A rollout that finishes is
   given a new target, so the kills keep landing on work.
3. High availability: two replicas sharing a Lease; the active one is SIGKILLed
   (never SIGTERMed) and the takeover timed.
4. Calm: faults off, everything must finish: every node done and schedulable
   (the admin's cordon still there), gates restored, workloads whole, the
   unchanged Module untouched, one swap per node and target, no replica active
   while another was.

It prints one summary line; on a violation, the seed and the node's history.
"""

from __future__ import annotations

import base64
import os
import random
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit.core.election import TIMING
from kmodkit_dev import cluster as devcluster
from kmodkit_dev import registry as devregistry
from kmodkit_dev import tenstorrent_demo as demo
from kmodkit_dev.api_proxy import api_proxy
from kmodkit_dev.nodes import set_down
from kmodkit_dev.waiting import wait_until
from tests.chaos import world as w
from tests.chaos.faults import TRAPS, ApiFaults, Write
from tests.chaos.invariants import Invariants, RolloutFleet
from tests.chaos.replicas import Replica, activity_overlaps
from tests.chaos.watch_feed import WatchFeed
from tests.integration import registry_fronts
from tests.integration.crds_util import install
from tests.integration.test_tt_support import FakeBuilder

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]

KILLS = int(os.environ.get("KMODKIT_CHAOS_KILLS", "50"))
HA_KILLS = int(os.environ.get("KMODKIT_CHAOS_HA_KILLS", "3"))
TRAP_EVERY = 5
DRIVER_VERSIONS = ("2.8.0", "2.9.0", "2.10.0", "2.11.0", "2.12.0", "2.13.0")
FIRMWARE_VERSIONS = ("19.9.0", "19.10.0", "19.11.0", "19.12.0")
MODULE_VERSIONS = ("v1", "v2", "v3", "v4", "v5")


@pytest.fixture(scope="module")
def chaos_cluster() -> Iterator[devcluster.Cluster]:
    """A control plane of its own: this test restarts its apiserver and fills it with nodes."""
    name = f"chaos-{os.getpid()}"
    c = devcluster.up(name, nodes=0, profile="plain", echo=print)
    try:
        yield c
    finally:
        devcluster.down(name, echo=print)


class Run:
    """Everything one chaos run holds, and the steps it takes."""

    def __init__(self, cluster: devcluster.Cluster, tmp: Path, seed: int, capsys: Any) -> None:
        self.cluster = cluster
        self.capsys = capsys
        self.tmp = tmp
        self.seed = seed
        self.rng = random.Random(seed)
        self.api = devcluster.api_client(cluster)
        self.core = client.CoreV1Api(self.api)
        self.kills: Counter[str] = Counter()
        self.takeovers: list[float] = []
        self.events: Counter[str] = Counter()
        self.steps_done: set[float] = set()
        self.registry: Any = None
        self.targets: dict[str, list[str]] = {"module": ["v1"], "driver": ["2.8.0"], "firmware": []}

    def report(self, line: str) -> None:
        """A line for the test output, shown whether the test passes or not."""
        with self.capsys.disabled():
            print(f"\n{line}", flush=True)

    def log(self, msg: str) -> None:
        print(f"chaos {time.strftime('%H:%M:%S')} {msg}", flush=True)


def _bump(run: Run, world: w.World, what: str) -> None:
    versions = {
        "module": MODULE_VERSIONS,
        "driver": DRIVER_VERSIONS,
        "firmware": FIRMWARE_VERSIONS,
    }[what]
    done = run.targets[what]
    nxt = versions[len(done)] if done else versions[0]
    done.append(nxt)
    run.log(f"{what} -> {nxt}")
    if what == "module":
        spec = world.module(world.changing, nxt, {"chaos-group": "module"})["spec"]
        w.patch_spec(
            run.api,
            w.MODULES,
            world.changing,
            {"moduleLoader": spec["moduleLoader"]},
            world.work_ns,
        )
    elif what == "driver":
        w.patch_spec(run.api, w.DRIVER, world.driver, {"version": nxt})
    elif len(done) == 1:
        client.CustomObjectsApi(run.api).create_cluster_custom_object(
            *w.FIRMWARE[:2], w.FIRMWARE[2], world.firmware_policy(nxt)
        )
    else:
        w.patch_spec(run.api, w.FIRMWARE, world.firmware, {"version": nxt})


def test_the_operator_loses_nothing_to_kills_and_faults(
    chaos_cluster: devcluster.Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("KMODKIT_CHAOS_SEED") or random.randrange(1 << 31))
    run = Run(chaos_cluster, tmp_path, seed, capsys)
    run.report(f"chaos seed {seed} (set KMODKIT_CHAOS_SEED={seed} to replay the schedule)")
    registry = devregistry.start(
        tmp_path / "registry", "kmodkit", secrets.token_urlsafe(16), tls=True
    )
    assert registry.ca is not None
    pki_dir = registry.ca.parent
    front = registry_fronts.start(
        pki_dir / "serving.crt", pki_dir / "serving.key", registry.host, registry.ca
    )
    world = w.World.named(uuid.uuid4().hex[:5], front.host)
    try:
        _run(run, world, registry, front)
    finally:
        front.stop()
        registry.stop()


def _run(run: Run, world: w.World, registry: devregistry.Registry, front: Any) -> None:
    api, core = run.api, run.core
    for module in (world.changing, world.stable):
        for version in MODULE_VERSIONS:
            registry.push(f"{registry.host}/kmods/{module}:{version}")
    install(api)
    for ns in (world.operator_ns, world.work_ns):
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(world.operator_ns, demo.flasher_account())
    run.registry = registry
    core.create_namespaced_secret(
        world.work_ns,
        {
            "metadata": {"name": "pull"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(b"{}").decode()},
        },
    )
    _pull_secret(run, world, front)
    devcluster.add_nodes(run.cluster, world.nodes(), echo=run.log)
    core.patch_node(world.external_cordon, {"spec": {"unschedulable": True}})

    inv = Invariants(
        rollouts=[
            # The Tenstorrent policies bound what they have in flight, not capacity lost
            # to others (maxUnavailable 100%; see docs/decisions.md).
            RolloutFleet("driver", world.driver_keys, frozenset(world.driver_nodes), 1, 30),
            RolloutFleet("firmware", world.firmware_keys, frozenset(world.firmware_nodes), 3, 30),
        ],
        external_cordon=world.external_cordon,
        stable_module=world.stable,
        stable_ready_label=world.ready_label(world.stable),
        changing_module=world.changing,
        module_nodes=frozenset(world.module_nodes),
        module_max_unavailable=len(world.module_nodes) // 10,
    )
    feeds = [
        WatchFeed("nodes", core.list_node, inv.node_event, label_selector=f"chaos={world.tag}"),
        WatchFeed("pods", core.list_pod_for_all_namespaces, inv.pod_event),
        WatchFeed("jobs", client.BatchV1Api(api).list_job_for_all_namespaces, inv.job_event),
    ]
    faults = ApiFaults(run.rng, kill=lambda replica, trap: _trap_kill(run, replicas, replica, trap))
    replicas: list[Replica] = []
    builder = FakeBuilder(api, world.operator_ns)
    try:
        with api_proxy(
            run.cluster.server, run.cluster.pki, listeners=2, interceptor=faults
        ) as proxy:
            env = {
                "KMODKIT_NAMESPACE": world.operator_ns,
                "KMODKIT_TT_SERVICE_ACCOUNT": "default",
                "KMODKIT_TT_FLASHER_SERVICE_ACCOUNT": demo.FLASHER_ACCOUNT,
                "KMODKIT_REGISTRY_CA": str(registry.ca),
                "KMODKIT_AGENT_IMAGE": "registry.invalid/kmodkit/agent:chaos",
            }
            for i in range(2):
                replicas.append(
                    Replica(
                        i,
                        proxy.kubeconfig(run.cluster.kubeconfig, run.tmp / f"kc{i}", i),
                        run.tmp / f"replica{i}.log",
                        env,
                    )
                )
            _install_phase(run, world, replicas[0], inv)
            _storm(run, world, replicas[0], faults, inv, front, registry)
            _high_availability(run, world, replicas, faults)
            faults.off()
            _calm(run, world, replicas, inv)
            for r in replicas:
                r.stop()
    except BaseException:
        # A run that stalls (a rollout never finishing) is often the result of what
        # the invariants already saw: show it, not only the timeout.
        seen = inv.violations + _overlaps(faults, replicas)
        if seen:
            run.report(f"seed {run.seed}: violations seen:\n" + "\n".join(seen[:10]))
        raise
    finally:
        for r in replicas:
            r.stop()
        builder.stop()
        for feed in feeds:
            feed.stop()
    _verdict(run, world, inv, faults, replicas, feeds)


def _overlaps(faults: ApiFaults, replicas: list[Replica]) -> list[str]:
    spans = activity_overlaps(
        [(wr.at, wr.replica) for wr in faults.writes], {r.index: r.lives for r in replicas}
    )
    return [f"two replicas active at once: {o}" for o in spans]


def _trap_kill(run: Run, replicas: list[Replica], replica: int, trap: str) -> None:
    if replicas[replica].kill(trap):
        run.kills[trap] += 1
        run.log(f"killed replica {replica} at a chosen point: {trap}")


def _install_phase(run: Run, world: w.World, op: Replica, inv: Invariants) -> None:
    api, core = run.api, run.core
    op.start()
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object(
        *w.MODULES[:2],
        world.work_ns,
        w.MODULES[2],
        world.module(world.changing, "v1", {"chaos-group": "module"}),
    )
    objects.create_namespaced_custom_object(
        *w.MODULES[:2],
        world.work_ns,
        w.MODULES[2],
        world.module(world.stable, "v1", {"chaos-stable": "yes"}),
    )
    objects.create_cluster_custom_object(*w.DRIVER[:2], w.DRIVER[2], world.driver_policy("2.8.0"))
    apps = client.AppsV1Api(api)
    wait_until(
        lambda: core.list_namespaced_service_account(world.work_ns).items,
        "the default service account",
    )
    for holder in world.holders():
        apps.create_namespaced_deployment(world.work_ns, holder)
    deployment, pdb = world.web()
    apps.create_namespaced_deployment(world.work_ns, deployment)
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(world.work_ns, pdb)
    apps.create_namespaced_daemon_set(world.work_ns, _telemetry(world))
    wait_until(
        lambda: (
            w.module_settled(
                core, world, world.changing, world.image(world.changing, "v1"), world.module_nodes
            )
            and w.module_settled(
                core, world, world.stable, world.image(world.stable, "v1"), world.stable_nodes
            )
        ),
        "both Modules loaded",
        timeout=300,
    )
    wait_until(
        lambda: set(w.kmd_versions(core, world.driver_nodes).values()) == {"2.8.0"},
        "tt-kmd 2.8.0 on the driver fleet",
        timeout=180,
    )
    inv.arm_module_budget()
    run.log("installed: Modules loaded, tt-kmd 2.8.0 everywhere")


def _telemetry(world: w.World) -> dict[str, Any]:
    return demo.telemetry_daemonset({"chaos": world.tag})


def _storm(
    run: Run,
    world: w.World,
    op: Replica,
    faults: ApiFaults,
    inv: Invariants,
    front: Any,
    registry: Any,
) -> None:
    faults.throttle_rate, faults.conflict_rate = 0.02, 0.03
    faults.expire_rate, faults.drop_rate = 0.05, 0.1
    _bump(run, world, "module")
    _bump(run, world, "driver")
    _bump(run, world, "firmware")
    traps = list(TRAPS.values())
    kills = 0
    while kills < KILLS:
        if kills % TRAP_EVERY == TRAP_EVERY - 1:
            trap = traps[(kills // TRAP_EVERY) % len(traps)]
            faults.arm(op.index, trap)
            run.log(f"armed {trap.name}")
            deadline = time.monotonic() + 20
            while op.alive and time.monotonic() < deadline:
                time.sleep(0.05)
            if faults.disarm(op.index) is not None:
                run.log(f"{trap.name} did not spring in 20 s; a timed kill instead")
                if op.kill("random"):
                    run.kills["random"] += 1
        else:
            time.sleep(run.rng.uniform(0.3, 5.0))
            if op.kill("random"):
                run.kills["random"] += 1
        kills = sum(run.kills.values())
        op.restart()
        _storm_events(run, world, kills, front, registry)
        _keep_busy(run, world)
    run.log(f"storm over: {kills} kills")


def _storm_events(run: Run, world: w.World, kills: int, front: Any, registry: Any) -> None:
    """Faults beyond the operator, at fixed points of the storm (once each)."""
    core = run.core
    steps: dict[float, Callable[[], object]] = {
        0.15: lambda: set_down(core, world.goes_down, True),
        0.3: lambda: _restart_apiserver(run),
        0.4: lambda: _registry_trouble(run, world, front, "5xx"),
        0.5: lambda: _registry_trouble(run, world, front, "stall"),
        0.55: lambda: _registry_trouble(run, world, front, "wrong-password"),
        0.6: lambda: _registry_trouble(run, world, front, "proxy"),
        0.7: lambda: set_down(core, world.goes_down, False),
    }
    for at, step in steps.items():
        if kills >= at * KILLS and at not in run.steps_done:
            run.steps_done.add(at)
            step()


def _restart_apiserver(run: Run) -> None:
    run.events["apiserver-restart"] += 1
    devcluster.restart(run.cluster, "kube-apiserver", echo=run.log)


def _registry_trouble(run: Run, world: w.World, front: Any, mode: str) -> None:
    if mode == "5xx":
        front.mode, front.status = registry_fronts.Mode.STATUS, 503
        _bump(run, world, "module")  # a new image to check while the registry fails
    elif mode == "stall":
        front.mode = registry_fronts.Mode.STALL
    elif mode == "wrong-password":
        front.released.set()
        front.mode = registry_fronts.Mode.PROXY
        _pull_secret(run, world, front, password="not-the-password")
    else:
        _pull_secret(run, world, front)
        front.released.clear()
    run.events[f"registry-{mode}"] += 1
    run.log(f"registry front: {mode}")


def _pull_secret(run: Run, world: w.World, front: Any, password: str = "") -> None:
    """The pull secret, naming the front: the operator reaches the registry through it."""
    registry = run.registry
    login = registry.dockerconfigjson(front.host, password)
    run.core.replace_namespaced_secret(
        "pull",
        world.work_ns,
        {
            "metadata": {"name": "pull"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(login.encode()).decode()},
        },
    )


def _keep_busy(run: Run, world: w.World) -> None:
    """A rollout that has finished gets its next target, so kills land on work."""
    core = run.core
    up = [n for n in world.driver_nodes if n != world.goes_down]
    if len(run.targets["driver"]) < len(DRIVER_VERSIONS) - 1 and w.rollout_done(
        core, world.driver_keys, up, held=[world.external_cordon]
    ):
        _bump(run, world, "driver")
    if len(run.targets["firmware"]) < len(FIRMWARE_VERSIONS) - 1 and w.rollout_done(
        core, world.firmware_keys, world.firmware_nodes
    ):
        _bump(run, world, "firmware")


def _high_availability(
    run: Run, world: w.World, replicas: list[Replica], faults: ApiFaults
) -> None:
    replicas[0].kill("to-ha")
    for r in replicas:
        r.args = ("--lease", "chaos")
        r.restart()
    _bump(run, world, "driver")
    for _ in range(HA_KILLS):
        active = _active(faults, since=time.monotonic() - 60)
        time.sleep(run.rng.uniform(1.0, 4.0))
        killed_at = time.monotonic()
        if not replicas[active].kill("active"):
            continue
        run.kills["ha-active"] += 1
        run.log(f"killed the active replica {active}")
        replicas[active].restart()
        took = _first_write_after(faults, killed_at, replicas[active])
        run.takeovers.append(took.at - killed_at)
        run.log(f"replica {took.replica} took over after {took.at - killed_at:.1f}s")
    # A rolling update: the standby is replaced while the active one works. The new
    # replica must wait; taking over at once would leave both writing for a while.
    standby = 1 - _active(faults, since=time.monotonic() - 60)
    if replicas[standby].kill("standby"):
        run.kills["ha-standby"] += 1
        run.log(f"killed the standby replica {standby}")
        replicas[standby].restart()
        time.sleep(TIMING.lease / 2)


def _first_write_after(faults: ApiFaults, at: float, killed: Replica) -> Write:
    """The first write after ``at`` by another replica or by the killed one's next life
    (a request the killed one had sent may still be answered after the kill)."""
    restarted = killed.lives[-1].started

    def first() -> Write | None:
        return next(
            (
                wr
                for wr in faults.writes
                if wr.at > at and (wr.replica != killed.index or wr.at > restarted)
            ),
            None,
        )

    return wait_until(first, "a replica to take over", timeout=120)


def _active(faults: ApiFaults, since: float) -> int:
    """The replica that wrote last (after ``since``), waiting for one to write."""

    def latest() -> list[int]:
        return [wr.replica for wr in faults.writes if wr.at > since][-1:]

    return int(wait_until(latest, "a replica to be active", timeout=120)[0])


def _calm(run: Run, world: w.World, replicas: list[Replica], inv: Invariants) -> None:
    core = run.core
    module_image = world.image(world.changing, run.targets["module"][-1])
    wait_until(
        lambda: w.module_settled(core, world, world.changing, module_image, world.module_nodes),
        f"the Module at {module_image} everywhere",
        timeout=300,
    )
    wait_until(
        lambda: w.rollout_done(
            core, world.driver_keys, world.driver_nodes, held=[world.external_cordon]
        ),
        "the driver rollout to finish",
        timeout=600,
    )
    wait_until(
        lambda: w.rollout_done(core, world.firmware_keys, world.firmware_nodes),
        "the firmware rollout to finish",
        timeout=300,
    )


def _verdict(
    run: Run,
    world: w.World,
    inv: Invariants,
    faults: ApiFaults,
    replicas: list[Replica],
    feeds: list[WatchFeed],
) -> None:
    core = run.core
    final_kmd = run.targets["driver"][-1]
    versions = w.kmd_versions(core, world.driver_nodes)
    inv.check(
        all(v == final_kmd for n, v in versions.items() if n != world.external_cordon),
        f"tt-kmd not at {final_kmd} everywhere: {versions}",
    )
    for n in (*world.driver_nodes, *world.firmware_nodes):
        node = core.read_node(n)
        inv.check(
            (node.metadata.labels or {}).get(w.GATE) == "true",
            f"deploy gate not restored on {n}",
            n,
        )
    inv.check(
        bool(core.read_node(world.external_cordon).spec.unschedulable), "the admin's cordon is gone"
    )
    stable_now = {
        p.metadata.uid
        for p in core.list_namespaced_pod(
            world.work_ns, label_selector=f"kmodkit.io/module={world.stable}"
        ).items
    }
    inv.check(stable_now == set(inv.stable_loaders), "the unchanged Module's loader pods changed")
    apps = client.AppsV1Api(run.api)

    def whole() -> bool:
        deployments = apps.list_namespaced_deployment(world.work_ns).items
        return all((d.status.available_replicas or 0) == d.spec.replicas for d in deployments)

    wait_until(whole, "every workload whole again", timeout=120)
    calls: Counter[tuple[str, str, str]] = Counter()
    for r in replicas:
        calls += r.swap_calls()
    repeated = sum(c - 1 for c in calls.values() if c > 1)
    for o in _overlaps(faults, replicas):
        inv.check(False, o)
    errors = [e for f in feeds for e in f.errors] + [
        e for r in replicas for e in r.unexpected_exits()
    ]
    kills = sum(run.kills.values())
    takeover = f"{max(run.takeovers):.1f}s" if run.takeovers else "none"
    run.report(
        f"CHAOS SUMMARY seed={run.seed} kills={kills} ({dict(run.kills)}) "
        f"takeovers={len(run.takeovers)} max={takeover} "
        f"faults={dict(faults.injected)} other={dict(run.events)} "
        f"swap-calls={sum(calls.values())} repeated={repeated} "
        f"checks={inv.checks} violations={inv.breaches} "
        f"max-in-flight={dict(inv.max_in_flight)} "
        f"max-module-unsettled={inv.max_module_unavailable} "
        f"readiness-changes={inv.readiness_changes}"
    )
    assert not errors, sorted(set(errors))
    assert kills >= KILLS
    assert not inv.violations, f"seed {run.seed}:\n" + "\n".join(inv.violations[:10])
