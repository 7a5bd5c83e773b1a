"""The built-in engine: kopf wiring for ``kmodkit.io/v1alpha1`` Modules.

Each Module gets a daemon that runs a reconcile pass whenever something it
depends on changes (its spec, a node's labels/kernel/readiness, its loader pods
or build Jobs) and otherwise sleeps. A pass reads everything it needs from the
watch caches, plans (pure functions in kmodkit.core.engine) and applies.
Nothing that matters lives in this process: the plan is rebuilt from the
cluster on every pass, so the operator can be killed at any moment.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from kmodkit.core import labels
from kmodkit.core.api import RegistryTLS
from kmodkit.core.api.module import API_VERSION, GROUP, KIND, PLURAL, VERSION, Module
from kmodkit.core.engine.build_plan import (
    BUILD_COMPONENT,
    DOCKERFILE_KEY,
    REPORTED_ANNOTATION,
    BuildJob,
    BuildPlan,
    BuildSettings,
    build_job_view,
    plan_builds,
    unsigned_images,
)
from kmodkit.core.engine.device_plugin import (
    DEVICE_PLUGIN_COMPONENT,
    DaemonSetView,
    DevicePluginPlan,
    daemon_set_view,
    plan_device_plugin,
    plugin_labels,
)
from kmodkit.core.engine.images import parse_image_reference
from kmodkit.core.engine.loader_plan import (
    ImageState,
    LoaderPlan,
    NeededImages,
    NodeOutcome,
    gated_on,
    labels_follow_pods,
    plan,
)
from kmodkit.core.engine.loader_pod import (
    COMPONENT_LABEL,
    LOADER_COMPONENT,
    MODULE_LABEL,
    UNLOADER_COMPONENT,
    LoaderPod,
    LoaderSettings,
    loader_pod_view,
)
from kmodkit.core.engine.module_status import module_status
from kmodkit.core.engine.node_events import node_decisions
from kmodkit.core.engine.node_interest import module_interest
from kmodkit.core.engine.registry import (
    DEFAULT_TIMEOUT_SECONDS,
    Answer,
    AnswerCache,
    Existence,
    PullSecret,
    check,
    read_pull_secret,
)
from kmodkit.core.events import CONDITION_REPEAT_SECONDS as REPORT_AGAIN
from kmodkit.core.events import ONCE
from kmodkit.core.nodes import NodeView, relabelled
from kmodkit.core.owners import controller_reference
from kmodkit.core.runtime import metrics
from kmodkit.core.runtime.informer import kind_lister
from kmodkit.core.runtime.loop import reconcile_loop
from kmodkit.core.runtime.owned_index import OwnedIndex
from kmodkit.core.runtime.unseen_writes import UnseenWrites
from kmodkit.core.runtime.watch_cache import CACHE_WAIT_SECONDS, InformerSpec, Shared
from kmodkit.core.runtime.writes import Write, WritePool

log = logging.getLogger("kmodkit.engine")

MODULE_REF = {"apiVersion": API_VERSION, "kind": KIND}
CONSUMER_RECHECK_SECONDS = 5.0
"""How soon a pass looks again at pods still gated on a node's labels before unloading it."""
CONSUMER_READS = 8
"""The nodes' gated pods read at once (list calls the informers cannot answer: any pod)."""
RETRY_FAILED_SECONDS = 30.0
"""How soon a pass whose writes were refused tries them again."""
CREATE_SLICE_SECONDS = 5.0
"""How long one pass creates loader pods before it ends and the next pass labels the nodes
whose pods turned ready meanwhile: without a slice, a new Module over 10,000 nodes would
label its first node only once every pod was created, a minute or more later."""
NEXT_SLICE_SECONDS = 0.05
"""How soon the pass after a cut-short creation starts."""


@dataclass(frozen=True)
class ModuleControllerSettings:
    loader: LoaderSettings
    build: BuildSettings
    registry_ca_bundle: str | None = None
    """Extra CA bundle for registry TLS (a private registry's CA); system CAs otherwise."""
    resync_seconds: float = 300.0
    recheck_seconds: float = 60.0
    """How often a missing or unreachable image is asked for again (a push may land)."""
    registry_timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    """The most one image check may take, redirects and token requests included."""

    @classmethod
    def from_env(cls) -> ModuleControllerSettings:
        env = os.environ
        return cls(
            loader=LoaderSettings(
                agent_image=env.get("KMODKIT_AGENT_IMAGE", "ghcr.io/kmodkit/agent:0.1.0"),
                firmware_host_path=env.get("KMODKIT_FIRMWARE_HOST_PATH", "/var/lib/firmware"),
            ),
            build=BuildSettings(
                builder_image=env.get("KMODKIT_BUILDER_IMAGE", "ghcr.io/kmodkit/builder:0.1.0"),
                signer_image=env.get("KMODKIT_SIGNER_IMAGE", "ghcr.io/kmodkit/signer:0.1.0"),
                registry_ca_config_map=env.get("KMODKIT_BUILD_REGISTRY_CA_CONFIGMAP", ""),
                registry_ca_key=env.get("KMODKIT_BUILD_REGISTRY_CA_KEY") or "ca.crt",
            ),
            registry_ca_bundle=env.get("KMODKIT_REGISTRY_CA") or None,
            recheck_seconds=float(env.get("KMODKIT_IMAGE_RECHECK_SECONDS", "60")),
            registry_timeout_seconds=float(
                env.get("KMODKIT_REGISTRY_TIMEOUT_SECONDS", str(DEFAULT_TIMEOUT_SECONDS))
            ),
        )


class ModuleController:
    """Reconcile loops for Modules; the caches it reads are in Shared."""

    def __init__(self, shared: Shared, settings: ModuleControllerSettings) -> None:
        self.shared = shared
        self.kube = shared.kube
        self.writes: WritePool = shared.kube.writes
        self.settings = settings
        self.answers = AnswerCache(other_ttl=settings.recheck_seconds)
        # (namespace, module) -> views of its objects, from the informers.
        self.loader_pods: OwnedIndex[tuple[str, str], LoaderPod] = OwnedIndex()
        self.build_jobs: OwnedIndex[tuple[str, str], BuildJob] = OwnedIndex()
        self.device_plugins: OwnedIndex[tuple[str, str], DaemonSetView] = OwnedIndex()
        self.plugin_pods: OwnedIndex[tuple[str, str], tuple[str, bool]] = OwnedIndex()
        # (namespace, module) -> its writes that landed but the caches do not show yet.
        self.unseen: dict[tuple[str, str], UnseenWrites] = {}
        # (namespace, module) -> the images its last pass needed.
        self.needed_images: dict[tuple[str, str], NeededImages] = {}
        self._reads = ThreadPoolExecutor(CONSUMER_READS, thread_name_prefix="kmodkit-read")

    @property
    def nodes(self) -> dict[str, NodeView]:
        return self.shared.nodes

    # -- wiring ---------------------------------------------------------------

    def register(self, registry: kopf.OperatorRegistry) -> None:
        wakeups = self.shared.wakeups
        # Informers with server-side selectors: only the operator's own objects are sent.
        ours = f"{labels.MANAGED_BY_LABEL}={labels.MANAGED_BY},{COMPONENT_LABEL}"
        loaders = f"{ours} in ({LOADER_COMPONENT},{UNLOADER_COMPONENT})"
        builds, plugins = f"{ours}={BUILD_COMPONENT}", f"{ours}={DEVICE_PLUGIN_COMPONENT}"

        def index(
            name: str, lister: Any, selector: str, view: Any, into: OwnedIndex[Any, Any]
        ) -> None:
            self.shared.watch(
                InformerSpec.indexed(
                    name,
                    lister,
                    selector,
                    lambda obj: (_module_of(obj), view(obj)),
                    into,
                    lambda module: wakeups.wake((PLURAL, *module)),
                )
            )

        pods = kind_lister("", "v1", "pods")
        index("loader pods", pods, loaders, loader_pod_view, self.loader_pods)
        index(
            "build jobs",
            kind_lister("batch", "v1", "jobs"),
            builds,
            build_job_view,
            self.build_jobs,
        )
        index(
            "device plugins",
            kind_lister("apps", "v1", "daemonsets"),
            plugins,
            daemon_set_view,
            self.device_plugins,
        )
        index("plugin pods", pods, plugins, _node_and_readiness, self.plugin_pods)

        @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
        async def module_changed(namespace: str | None, name: str, **_: Any) -> None:
            wakeups.wake((PLURAL, namespace or "", name))

        @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=30)
        async def module_daemon(
            name: str,
            namespace: str | None,
            body: kopf.Body,
            stopped: kopf.DaemonStopped,
            **_: Any,
        ) -> None:
            key = (namespace or "", name)

            def one_pass() -> float | None:
                return self.reconcile(
                    dict(body),
                    self.loader_pods.get(key),
                    self.build_jobs.get(key),
                    self.device_plugins.get(key),
                    [node for node, ready in self.plugin_pods.get(key) if ready],
                )

            # Changes of nodes it neither selects, labels nor has pods on wake no pass over it.
            wakeups.interest(
                (PLURAL, *key),
                module_interest(
                    *key,
                    lambda: (body.get("spec") or {}).get("selector") or {},
                    lambda: (pod.node for pod in self.loader_pods.get(key)),
                ),
            )
            try:
                await reconcile_loop(
                    (PLURAL, *key),
                    metrics.instrumented(PLURAL, f"{namespace}/{name}", one_pass),
                    stopped,
                    wakeups,
                    self.settings.resync_seconds,
                )
            finally:
                metrics.forget(PLURAL, f"{namespace}/{name}")
                self.unseen.pop(key, None)
                self.needed_images.pop(key, None)

        @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
        def module_deleted(name: str, namespace: str | None, body: kopf.Body, **_: Any) -> None:
            self.finalize(dict(body), self.loader_pods.get((namespace or "", name)))

    # -- a pass ---------------------------------------------------------------

    def reconcile(
        self,
        body: dict[str, Any],
        pods: list[Any],
        jobs: list[Any],
        daemon_sets: list[DaemonSetView] | None = None,
        plugin_ready_on: list[str] | None = None,
    ) -> float | None:
        """One pass over a Module; returns seconds until a timed retry is due."""
        meta = body.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if not self.shared.nodes_synced:
            return CACHE_WAIT_SECONDS
        nodes = list(self.nodes.values())  # the watch updates the cache from another thread
        unseen = self._unseen(ns, name, pods)
        try:
            module = Module.model_validate(body)
        except ValidationError as err:
            # Nothing can be planned, but the labels still follow the pods.
            follow = LoaderPlan(node_labels=labels_follow_pods(ns, name, nodes, pods))
            self.writes.run(self._label_nodes(follow.node_labels, body, unseen).events)
            self._write_status(body, module_status(body, follow, invalid=str(err)))
            return None
        succeeded = {j.image for j in jobs if j.succeeded}
        dockerfile = functools.cache(
            lambda cm: (self.kube.read_config_map(ns, cm) or {}).get(DOCKERFILE_KEY)
        )
        now = time.time()

        def builds_for(needed: NeededImages) -> BuildPlan:
            """The images' states, and the build and sign Jobs they call for."""
            tls = {image: r.registry_tls for image, r in needed.images.items()}
            existence = self._check_images(module, tls, succeeded)
            # A signed image the registry lacks is made from its unsigned one: ask for it too.
            unsigned = {
                image: r.sign.unsigned_image_registry_tls if r.sign else None
                for image, r in unsigned_images(needed.images, existence).items()
            }
            existence |= self._check_images(module, unsigned, succeeded)
            return plan_builds(
                module,
                needed.images,
                needed.nodes,
                nodes,
                existence,
                jobs,
                dockerfile,
                self.settings.build,
                now,
            )

        # The plan needs the states of the images it needs. Those of the last pass are
        # almost always the same, so a pass plans once (a whole-fleet plan is most of a
        # pass's time at 10,000 nodes); on the first pass, or when the images or their
        # nodes changed, it plans again with the right ones.
        assumed = self.needed_images.get((ns, name)) or NeededImages.of(
            plan(module, nodes, pods, {}, self.settings.loader)
        )
        builds = builds_for(assumed)
        consumers: dict[str, list[str]] = {}

        def final_plan() -> LoaderPlan:
            """The plan, once the pods gated on the labels of the nodes about to unload
            are read (each node once a pass)."""
            done = plan(module, nodes, pods, builds.states, self.settings.loader, consumers)
            if not done.awaiting_consumers:
                return done
            consumers.update(self._consumers(done.awaiting_consumers, ns, name))
            return plan(module, nodes, pods, builds.states, self.settings.loader, consumers)

        final = final_plan()
        if not assumed.covers(final, builds.states):
            builds = builds_for(NeededImages.of(final))
            final = final_plan()
        self.needed_images[(ns, name)] = NeededImages.of(final)

        owner = controller_reference({**body, **MODULE_REF})
        for job in builds.create:
            job["metadata"]["ownerReferences"] = [owner]
        failures = self.writes.failures(
            [
                *(
                    Write(
                        f"creating Job {ns}/{job['metadata']['name']}", _bind(self.kube.create, job)
                    )
                    for job in builds.create
                ),
                *(
                    Write(f"deleting Job {ns}/{j}", _bind(self.kube.delete_job, ns, j))
                    for j in builds.delete
                ),
            ]
        )
        unposted = set()
        for event in builds.events:
            if not self.kube.events.post(
                _module_ref(body),
                event.reason,
                event.message,
                warning=event.warning,
                repeat_after=ONCE,
            ):
                unposted.add(event.job)
        # Recorded on each Job only once its events are posted: a restart in between, or
        # an event the apiserver refused, repeats that Job's events rather than losing
        # them. The loop's debounce before the next pass usually lets the watch deliver
        # this write first; a slower watch can repeat an event, rarely.
        failures += self.writes.failures(
            Write(
                f"annotating Job {ns}/{job_name}",
                _bind(self.kube.annotate_job, ns, job_name, {REPORTED_ANNOTATION: reported}),
            )
            for job_name, reported in builds.reported.items()
            if job_name not in unposted
        )
        # Labels before pods: they follow the pods this pass saw, so they need none of its
        # creations, and a node whose pod turned ready is labelled before the next slice.
        labelled = self._label_nodes(
            _with_plugin_labels(final.node_labels, ns, name, nodes, plugin_ready_on or []),
            body,
            unseen,
            final.outcomes,
        )
        failures += labelled.failures
        landed = labelled.landed
        # A node whose ready label just went need not wait for the watch to show it: the
        # plan is made again with the labels as written, so that its gated pods are read
        # and, when none is left, its module is replaced in this pass. A rollout wave
        # starts a watch round trip and a pass sooner.
        ready_key = labels.READY.key(ns, name)
        if any(ready_key in change and change[ready_key] is None for change in landed.values()):
            nodes = relabelled(nodes, landed)
            final = final_plan()
        # No watch sees gated pods leave: look again soon rather than at the resync.
        held = bool(final.held)
        pod_failures, cut_short = self._apply_pods(final, owner, ns, unseen)
        failures += pod_failures
        self.writes.run(labelled.events)
        plugin = plan_device_plugin(module, nodes, daemon_sets or [])
        failures += self._apply_device_plugin(plugin, owner, ns)
        self._report_decisions(final, body)
        self._report_failures(body, "ApplyFailed", failures)
        metrics.node_states(PLURAL, f"{ns}/{name}", Counter(o.phase.value for o in final.outcomes))
        status = module_status(body, final, apply_failures=failures)
        if plugin.status is not None:
            status["devicePlugin"] = plugin.status
        elif (body.get("status") or {}).get("devicePlugin") is not None:
            status["devicePlugin"] = None  # as KMM: cleared once the plugin is removed
        self._write_status(body, status)
        waiting = any(
            s.state in (ImageState.MISSING, ImageState.UNKNOWN) for s in builds.states.values()
        )
        requeues = [
            t
            for t in (
                builds.requeue_after,
                self.settings.recheck_seconds if waiting else None,
                CONSUMER_RECHECK_SECONDS if held else None,
                RETRY_FAILED_SECONDS if failures else None,
                NEXT_SLICE_SECONDS if cut_short else None,
                unseen.next_due(),
            )
            if t
        ]
        return min(requeues, default=None)

    def _check_images(
        self, module: Module, images: Mapping[str, RegistryTLS | None], just_built: Iterable[str]
    ) -> dict[str, Answer]:
        """Whether each image exists, asked with its registry TLS settings (cached)."""
        trigger = str(module.spec.image_rebuild_trigger_generation or "")
        fresh = set(just_built)
        # The pull secret is read once per pass, and only if the registry is asked.
        secret = functools.cache(lambda: self._pull_secret(module))
        answers: dict[str, Answer] = {}
        for image, tls in images.items():
            cached = self.answers.get((image, trigger))
            if cached is not None and not (
                image in fresh and cached.existence is not Existence.EXISTS
            ):
                answers[image] = cached
                continue
            pull = secret()
            if pull.problem:
                # Not cached: the next pass reads the Secret again, so a fix is seen at once
                # rather than after the registry back-off.
                answers[image] = Answer(Existence.UNKNOWN, pull.problem)
                continue
            answer = check(
                image,
                pull.credentials_for(parse_image_reference(image).registry),
                tls,
                self.settings.registry_ca_bundle,
                self.settings.registry_timeout_seconds,
            )
            self.answers.put((image, trigger), answer)
            answers[image] = answer
        return answers

    def _pull_secret(self, module: Module) -> PullSecret:
        ref = module.spec.image_repo_secret
        if ref is None:
            return PullSecret()
        ns = module.metadata.namespace or ""
        data = self.kube.read_secret(ns, ref.name or "")
        # A Secret that is not there yet is no login, as for the kubelet: public images
        # still resolve, private ones say they need credentials.
        return PullSecret() if data is None else read_pull_secret(f"{ns}/{ref.name}", data)

    def _apply_pods(
        self, final: LoaderPlan, owner: Mapping[str, Any], ns: str, unseen: UnseenWrites
    ) -> tuple[list[str], bool]:
        """Create, then delete; a refused call is one failure (returned, with the API's
        message), and the rest of the pass goes on. Creations run for one slice of time;
        whether some were left for the next pass is returned too."""
        # Creations first, then deletions: a pod is deleted only once the pod that takes
        # over its record (a successor, an unloader) exists.
        create = [p for p in final.create if not unseen.unseen(_pod_write(p["metadata"]["name"]))]
        for pod in create:
            pod["metadata"]["ownerReferences"] = [owner]
        made = self.writes.run_for(
            [
                Write(f"creating Pod {ns}/{pod['metadata']['name']}", _bind(self.kube.create, pod))
                for pod in create
            ],
            CREATE_SLICE_SECONDS,
        )
        sent, later = create[: len(made)], create[len(made) :]
        # A node whose creation was refused or left for later keeps its old pods.
        kept = {p["spec"]["nodeName"] for p in later}
        kept |= {pod["spec"]["nodeName"] for pod, said in zip(sent, made, strict=True) if said}
        for pod, said in zip(sent, made, strict=True):
            if said is None:
                unseen.landed(_pod_write(pod["metadata"]["name"]))
        failures = [said for said in made if said is not None]
        deletes = [
            (node, pod_name)
            for node, names in final.deletes_by_node.items()
            if node not in kept
            for pod_name in names
            if not unseen.unseen(_deletion_write(pod_name))
        ]
        deleted = self.writes.run(
            Write(f"deleting Pod {ns}/{pod_name}", _bind(self.kube.delete_pod, ns, pod_name))
            for _, pod_name in deletes
        )
        failures += [d for d in deleted if d is not None]
        for (_, pod_name), said in zip(deletes, deleted, strict=True):
            if said is None:
                unseen.landed(_deletion_write(pod_name))
        # The unloader's success is the unload; its record going (deleted) is when it is
        # told: by the pass whose deletion landed, not by one the watch had not caught up with.
        refused = {node for (node, _), d in zip(deletes, deleted, strict=True) if d is not None}
        unloaded = set(final.unloaded) & ({node for node, _ in deletes} - refused)
        self.writes.run(
            Write(
                "posting Event ModuleUnloaded",
                _bind(
                    self._post,
                    _node_ref(view),
                    "ModuleUnloaded",
                    f"Module {ns}/{owner['name']} unloaded from the kernel",
                    False,
                    0.0,
                ),
            )
            for node in sorted(unloaded)
            if (view := self.nodes.get(node)) is not None
        )
        return failures, bool(later)

    def _apply_device_plugin(
        self, plugin: DevicePluginPlan, owner: Mapping[str, Any], ns: str
    ) -> list[str]:
        writes = []
        if plugin.apply is not None:
            plugin.apply["metadata"]["ownerReferences"] = [owner]
            writes.append(
                Write(
                    f"applying DaemonSet {ns}/{plugin.apply['metadata']['name']}",
                    _bind(self.kube.apply_daemon_set, plugin.apply),
                )
            )
        writes += [
            Write(f"deleting DaemonSet {ns}/{ds}", _bind(self.kube.delete_daemon_set, ns, ds))
            for ds in plugin.delete
        ]
        return self.writes.failures(writes)

    def _report_failures(
        self, body: Mapping[str, Any], reason: str, messages: Iterable[str]
    ) -> None:
        self.writes.run(
            Write(
                f"posting Event {reason}",
                _bind(self._post, _module_ref(body), reason, message, True, REPORT_AGAIN),
            )
            for message in messages
        )

    def _report_decisions(self, final: LoaderPlan, body: Mapping[str, Any]) -> None:
        """A node failed or held back: told on the Module and on the node."""
        meta = body.get("metadata") or {}
        module = f"{meta.get('namespace')}/{meta.get('name')}"
        posts = []
        for d in node_decisions(final):
            about = [(_module_ref(body), f"node {d.node}: {d.message}")]
            if (view := self.nodes.get(d.node)) is not None:
                about.append((_node_ref(view), f"Module {module}: {d.message}"))
            posts += [
                Write(
                    f"posting Event {d.reason}",
                    _bind(self._post, ref, d.reason, message, d.warning, REPORT_AGAIN),
                )
                for ref, message in about
            ]
        self.writes.run(posts)

    def _post(
        self, ref: Mapping[str, Any], reason: str, message: str, warning: bool, again: float
    ) -> None:
        self.kube.events.post(ref, reason, message, warning=warning, repeat_after=again)

    def _label_nodes(
        self,
        changes: Mapping[str, Mapping[str, str | None]],
        body: Mapping[str, Any],
        unseen: UnseenWrites,
        outcomes: Iterable[NodeOutcome] = (),
    ) -> Labelled:
        """Write ``changes``; ``outcomes`` say what the plan does on each node (told in the
        Event of a node that stops being ready)."""
        doing = {o.node: o.message for o in outcomes if o.node in changes}
        meta = body.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        ready_key = labels.READY.key(ns, name)

        def event(node: str, change: Mapping[str, str | None]) -> Write | None:
            view = self.nodes.get(node)
            if ready_key not in change or view is None:
                return None
            if change[ready_key] is not None:
                reason, message = "ModuleLoaded", f"Module {ns}/{name} loaded into the kernel"
            else:
                # Not "unloaded": the label goes first (gated pods leave, a pod stopped
                # serving), and the module is unloaded, if at all, only later (ModuleUnloaded).
                reason = "ModuleNotReady"
                message = f"Module {ns}/{name} is no longer ready on this node"
                if doing.get(node):
                    message += f": {doing[node]}"
            # On the node only, as KMM: the Module's status counts the nodes, and one Event
            # per node on the Module would be a second write per node for a whole fleet.
            return Write(
                f"posting Event {reason}",
                _bind(self._post, _node_ref(view), reason, message, False, 0.0),
            )

        # Nodes that become ready are labelled before any node stops being ready: written
        # side by side, a node leaving could land first and, for a moment, more nodes than
        # the budget allows would be unready at once.
        first, then = readiness_first(changes)
        out = Labelled()
        refused = set()
        for batch in (first, then):
            due = [n for n in sorted(batch) if not unseen.unseen(_label_write(n, batch[n]))]
            made = self.writes.run(
                Write(f"labelling Node {node}", _bind(self.kube.label_node, node, batch[node]))
                for node in due
            )
            for node, said in zip(due, made, strict=True):
                if said is None:
                    unseen.landed(_label_write(node, batch[node]))
                    if (post := event(node, batch[node])) is not None:
                        out.events.append(post)
                else:
                    out.failures.append(said)
                    refused.add(node)
        out.landed = {n: c for n, c in changes.items() if n not in refused}
        return out

    def _unseen(self, ns: str, name: str, pods: Iterable[LoaderPod]) -> UnseenWrites:
        """The Module's landed writes the caches do not show yet, those they show forgotten."""
        names = {p.name for p in pods}
        leaving = {p.name for p in pods if p.deleting}
        unseen = self.unseen.setdefault((ns, name), UnseenWrites())

        def seen(write: Hashable) -> bool:
            match write:
                case ("pod", pod):
                    return pod in names
                case ("deleted", pod):
                    return pod not in names or pod in leaving
                case ("labels", str(node), tuple(change)):
                    view = self.nodes.get(node)
                    return view is None or all(view.labels.get(k) == v for k, v in change)
            return True

        unseen.forget_seen(seen)
        return unseen

    def _consumers(self, nodes: Iterable[str], ns: str, name: str) -> dict[str, list[str]]:
        """``_gated_pods`` of each node, read side by side: a rollout wave asks it of every
        node of the wave (maxUnavailable of them), one list call each."""
        asked = list(nodes)
        read = self._reads.map(lambda n: self._gated_pods(n, ns, name), asked)
        return dict(zip(asked, read, strict=True))

    def _gated_pods(self, node: str, ns: str, name: str) -> list[str]:
        """``namespace/name`` of the pods on ``node`` that run only while it carries one of
        the Module's readiness labels: they hold the driver and must leave before it unloads."""
        keys = (labels.READY.key(ns, name), labels.VERSION_READY.key(ns, name))
        return [
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in self.kube.pods_on_node(node)
            if any(gated_on(p, key) for key in keys)
        ]

    def _write_status(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        metrics.degraded(PLURAL, f"{meta.get('namespace')}/{meta.get('name')}", status)
        self.kube.write_status(GROUP, VERSION, PLURAL, body, status)

    # -- deletion -------------------------------------------------------------

    def finalize(self, body: Mapping[str, Any], pods: list[Any]) -> None:
        """Unload everywhere and remove the labels; kopf keeps the finalizer until done.

        The plan is the engine's own with every node retiring: the labels go
        first so gated pods (device plugins) leave each node, then an unloader
        pod unloads the module, and only its success lets the node go. A pod
        on a node the cache does not hold (yet) stays: that node's labels were
        not taken away, and the pod GC removes pods of nodes that are gone.
        """
        if not self.shared.nodes_synced:
            raise kopf.TemporaryError("waiting for the caches to fill", delay=CACHE_WAIT_SECONDS)
        meta = body.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if (meta.get("annotations") or {}).get(labels.HANDED_OVER) == "true":
            # Another engine serves these nodes now (the same driver, the same labels):
            # nothing is unloaded or unlabelled, and the loader pods, garbage-collected
            # with the Module, leave the driver loaded.
            legacy = sorted(p.node for p in pods if not p.unloader and not p.leaves_loaded)
            if legacy:
                raise kopf.TemporaryError(
                    f"cannot hand over: the loader pods on {', '.join(legacy[:5])} predate "
                    "loaders that leave the driver loaded, and would unload it when deleted; "
                    "remove the annotation to unload, or keep the Module",
                    delay=CACHE_WAIT_SECONDS,
                )
            log.info("Module %s/%s handed over to another engine; nothing unloaded", ns, name)
            return
        module = _removal_module(body)
        nodes = list(self.nodes.values())  # the watch updates the cache from another thread
        seen = {n.name for n in nodes}
        removal = plan(module, nodes, pods, {}, self.settings.loader, removing=True)
        if removal.awaiting_consumers:
            consumers = self._consumers(removal.awaiting_consumers, ns, name)
            removal = plan(module, nodes, pods, {}, self.settings.loader, consumers, removing=True)
        owner = controller_reference({**body, **MODULE_REF})
        unseen = self._unseen(ns, name, pods)
        # A creation left for later (a fleet-wide removal) is made by the next try below.
        failures, _ = self._apply_pods(removal, owner, ns, unseen)
        labelled = self._label_nodes(
            _with_plugin_labels(removal.node_labels, ns, name, nodes, []),
            body,
            unseen,
            removal.outcomes,
        )
        failures += labelled.failures
        self.writes.run(labelled.events)
        self._report_decisions(removal, body)
        self._report_failures(body, "ApplyFailed", failures)
        # The passes stop with the deletion: without this the status would go on saying
        # what the last one saw (all loaded) while an unload is refused.
        self._write_status(body, module_status(body, removal, apply_failures=failures))
        if pods:
            not_seen = sorted({p.node for p in pods if p.node not in seen})
            held = [f"{o.node} ({o.message})" for o in removal.outcomes]
            waiting = [*(f"{n} (node not seen yet)" for n in not_seen), *held]
            detail = f"; still held on {', '.join(waiting[:5])}" if waiting else ""
            raise kopf.TemporaryError(
                f"waiting for {len({p.node for p in pods})} nodes to unload{detail}", delay=3
            )
        self.unseen.pop((ns, name), None)


@dataclass
class Labelled:
    """What a pass's label writes did."""

    failures: list[str] = field(default_factory=list)
    """The API's refusals."""
    landed: dict[str, Mapping[str, str | None]] = field(default_factory=dict)
    """The changes that landed, in this pass or an earlier one whose writes the watch has
    not shown yet."""
    events: list[Write] = field(default_factory=list)
    """Each node's ModuleLoaded or ModuleNotReady Event for this pass's writes: posted after
    the pass's pod writes, which need no Event first."""


def _bind(call: Callable[..., object], *args: object) -> Callable[[], object]:
    return functools.partial(call, *args)


def _pod_write(name: str) -> tuple[str, str]:
    return ("pod", name)


def _deletion_write(name: str) -> tuple[str, str]:
    return ("deleted", name)


def _label_write(node: str, change: Mapping[str, str | None]) -> tuple[str, str, tuple[Any, ...]]:
    return ("labels", node, tuple(sorted(change.items())))


def _module_ref(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    # A namespaced object's Event must name its namespace, or it is refused.
    return {**MODULE_REF, **{k: meta.get(k) for k in ("name", "namespace", "uid")}}


def _node_ref(view: NodeView) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Node", "name": view.name, "uid": view.uid}


def _with_plugin_labels(
    changes: Mapping[str, Mapping[str, str | None]],
    ns: str,
    name: str,
    nodes: list[NodeView],
    plugin_ready_on: list[str],
) -> dict[str, dict[str, str | None]]:
    """The loader plan's label changes with the device-plugin-ready label's."""
    merged = {node: dict(change) for node, change in changes.items()}
    for node, change in plugin_labels(ns, name, nodes, plugin_ready_on).items():
        merged.setdefault(node, {}).update(change)
    return merged


def _module_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str((meta.get("labels") or {}).get(MODULE_LABEL, "")))


def _node_and_readiness(obj: Mapping[str, Any]) -> tuple[str, bool]:
    view = loader_pod_view(obj)
    return (view.node, view.ready)


def _removal_module(body: Mapping[str, Any]) -> Module:
    """The Module being deleted, for its removal plan (which reads only its name, loader
    service account and pull secret): one that no longer validates is still unloaded."""
    try:
        return Module.model_validate(body)
    except ValidationError:
        spec = body.get("spec") or {}
        loader = spec.get("moduleLoader") or {}
        return Module.model_validate(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": body.get("metadata") or {},
                "spec": {
                    "selector": {},
                    **(
                        {"imageRepoSecret": spec["imageRepoSecret"]}
                        if spec.get("imageRepoSecret")
                        else {}
                    ),
                    "moduleLoader": {
                        "serviceAccountName": loader.get("serviceAccountName"),
                        "container": {
                            "modprobe": {"moduleName": "unused"},
                            "kernelMappings": [{"regexp": "^$", "containerImage": "unused"}],
                        },
                    },
                },
            }
        )


def readiness_first(
    changes: Mapping[str, Mapping[str, str | None]],
) -> tuple[dict[str, Mapping[str, str | None]], dict[str, Mapping[str, str | None]]]:
    """The label changes in two batches: those that remove no label, then those that do."""
    adds = {n: c for n, c in changes.items() if all(v is not None for v in c.values())}
    return adds, {n: c for n, c in changes.items() if n not in adds}
