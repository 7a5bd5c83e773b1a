"""kopf wiring: one operator process serving every enabled backend.

Handlers hold no state; everything they need is read from the cluster. The
health endpoint (kopf's liveness endpoint) reports which backends run and why
any did not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys
import time
from typing import Any

import kopf

from kmodkit.core import labels
from kmodkit.core.runtime import metrics
from kmodkit.core.runtime.kube import Kube
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.plugins import Discovered, discover
from kmodkit.core.runtime.resource_controller import ResourceController
from kmodkit.core.runtime.watch_cache import Shared

MODULE_FINALIZER = f"{labels.KMODKIT_PREFIX}/module-finalizer"
"""Finalizer on kmodkit Modules: held until the module is unloaded everywhere."""

log = logging.getLogger("kmodkit")


def _configure(settings: kopf.OperatorSettings, namespace: str) -> None:
    # Progress and finalizers of our own resources go under our own keys; kopf
    # never writes its bookkeeping onto Nodes or Pods (those are observed only).
    settings.persistence.finalizer = MODULE_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=labels.KMODKIT_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=labels.KMODKIT_PREFIX, key="last-handled-configuration"
    )
    # kopf's own per-handler events would drown the ones kmodkit posts.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    settings.peering.lifetime = PEER_LIFETIME_SECONDS


def build_registry(
    namespace: str, found: list[Discovered], shared: Shared
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    shared.register(registry)
    ModuleController(shared, ModuleControllerSettings.from_env()).register(registry)
    for d in found:
        if d.active and d.backend is not None:
            for resource in d.backend.resources:
                ResourceController(d.name, resource, shared).register(registry)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        _configure(settings, namespace)
        for d in found:
            if d.error:
                log.error("backend %s failed to load: %s", d.name, d.error)
            elif d.enabled:
                log.info("backend %s %s loaded", d.name, d.backend.version if d.backend else "")
            else:
                log.info("backend %s is installed but disabled", d.name)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account or the current kubeconfig, whichever applies.
        return kopf.login_via_client(**kwargs)

    @kopf.on.probe(id="backends", registry=registry)
    def backends_probe(**_: Any) -> dict[str, str]:
        return {
            d.name: (
                "running" if d.active else "disabled" if not d.enabled else f"failed: {d.error}"
            )
            for d in found
        }

    return registry


def backend_settings() -> dict[str, str]:
    """Operator configuration for backends: every ``KMODKIT_*`` environment variable.

    The chart sets these (images, ``controller.extraEnv`` proxy variables under
    ``KMODKIT_EXTRA_ENV_*``, deploy gates); backends read what they need.
    """
    return {k: v for k, v in os.environ.items() if k.startswith("KMODKIT_")}


PEER_LIFETIME_SECONDS = 20
"""How long a silent replica counts as alive: a SIGKILLed active one is replaced this soon."""


def _peering(name: str) -> dict[str, Any]:
    """kopf's arguments for running alone, or as one of several replicas.

    Peers in one ClusterKopfPeering pause while a live peer of higher priority
    exists. The priority falls with the start time (microseconds, plus a random
    tie-break below them), so the oldest live replica is the active one: a
    replica that starts (a restart, a rolling update) never takes over from one
    that is working, which would leave both writing until the older one noticed.
    Once the active one stops (or its keep-alives stop for
    ``PEER_LIFETIME_SECONDS``), the next oldest takes over.
    """
    if not name:
        return {"standalone": True}
    started = time.time_ns() // 1000
    return {"peering_name": name, "priority": ((1 << 52) - started) * 1024 + random.randrange(1024)}


def _api_client() -> Any:
    from kubernetes import client
    from kubernetes import config as kube_config

    cfg: Any = kube_config  # untyped module
    try:
        cfg.load_incluster_config()
    except cfg.ConfigException:
        cfg.load_kube_config()
    api = client.ApiClient()
    metrics.count_requests(api)
    return api


def run_operator(
    namespace: str,
    health_host: str,
    health_port: int,
    enabled: set[str] | None,
    peering: str = "",
    metrics_port: int = 0,
) -> int:
    json_logs = not sys.stderr.isatty()
    kopf.configure(
        log_format=kopf.LogFormat.JSON if json_logs else kopf.LogFormat.PLAIN, verbose=False
    )
    # kopf logs every handler run at INFO; at fleet scale (node events) that
    # is noise. kmodkit logs what matters itself.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    found = discover(enabled)
    shared = Shared(Kube(_api_client()), namespace, settings=backend_settings())
    registry = build_registry(namespace, found, shared)
    metrics.register(registry)
    metrics.serve(metrics_port, health_host)
    asyncio.run(
        _serve(
            shared,
            registry=registry,
            clusterwide=True,
            liveness_endpoint=f"http://{health_host}:{health_port}/healthz",
            **_peering(peering),
        )
    )
    return 0


async def _serve(shared: Shared, **operator_args: Any) -> None:
    """Run kopf; when a watched API disappears, start the watches afresh.

    kopf ends the whole operator when a watch answers 404 — which is what
    removing a CRD it watched (upstream KMM's, say) does. Every piece of
    progress is in the cluster, so starting over in-process is safe and beats
    a crash loop: the caches are dropped and refilled from fresh listings.
    """
    while True:
        try:
            await kopf.operator(**operator_args)
            return
        except Exception as err:  # kopf's APINotFoundError is not public
            if getattr(err, "status", None) != 404:
                raise
            log.warning("a watched API went away (%s); restarting the watches", err)
            shared.forget()
