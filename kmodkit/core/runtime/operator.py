"""kopf wiring: one operator process serving every enabled backend.

Handlers hold no state; everything they need is read from the cluster. The
health endpoint (kopf's liveness endpoint) reports which backends run and why
any did not.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import kopf

from kmodkit.core import labels
from kmodkit.core.runtime import metrics
from kmodkit.core.runtime.kube import Kube
from kmodkit.core.runtime.lease import Lease, identity
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.plugins import Discovered, discover
from kmodkit.core.runtime.resource_controller import ResourceController
from kmodkit.core.runtime.watch_cache import Shared

MODULE_FINALIZER = f"{labels.KMODKIT_PREFIX}/module-finalizer"
"""Finalizer on kmodkit Modules: held until the module is unloaded everywhere."""

log = logging.getLogger("kmodkit")

LEASE_LOST_EXIT = 3
"""The exit status of a replica that lost its Lease (its pod restarts as a standby)."""


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


def _elected(name: str, namespace: str, health_host: str, health_port: int) -> Lease:
    """Wait, answering health checks as a standby, until this process holds the Lease
    ``name``; then keep it, ending the process the moment it cannot."""
    # One try per request: a renewal must not hide a long wait in the client's retries.
    lease = Lease(_api_client(retries=False), namespace, name, identity())
    with standby_health(health_host, health_port):
        lease.acquire()
    lease.hold(lost=_end_now)
    return lease


def _end_now() -> None:
    # No cleanup: a replica that may no longer be the only one writes nothing more.
    os._exit(LEASE_LOST_EXIT)


@contextlib.contextmanager
def standby_health(host: str, port: int) -> Iterator[None]:
    """Answer ``/healthz`` with 200 while this replica waits, so a rolling update sees it
    ready; the port is handed to kopf's own endpoint once the wait ends."""

    class Standby(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/healthz"
            self.send_response(200 if found else 404)
            self.end_headers()
            if found:
                self.wfile.write(b'{"standby": true}')

        def log_message(self, *_: Any) -> None:  # probes every few seconds: not news
            pass

    server = http.server.ThreadingHTTPServer((host, port), Standby)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _api_client(retries: bool = True) -> Any:
    from kubernetes import client
    from kubernetes import config as kube_config

    cfg: Any = kube_config  # untyped module
    try:
        cfg.load_incluster_config()
    except cfg.ConfigException:
        cfg.load_kube_config()
    config: Any = client.Configuration.get_default_copy()
    if not retries:
        config.retries = False
    api = client.ApiClient(config)
    metrics.count_requests(api)
    return api


def run_operator(
    namespace: str,
    health_host: str,
    health_port: int,
    enabled: set[str] | None,
    lease: str = "",
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
    held = _elected(lease, namespace, health_host, health_port) if lease else None
    try:
        asyncio.run(
            _serve(
                shared,
                registry=registry,
                clusterwide=True,
                liveness_endpoint=f"http://{health_host}:{health_port}/healthz",
                standalone=True,
            )
        )
    finally:
        if held is not None:
            held.release()
    return 0


async def _serve(shared: Shared, **operator_args: Any) -> None:
    """Run kopf; when a watched API disappears, start the watches afresh.

    kopf ends the whole operator when a watch answers 404 — which is what
    removing a CRD it watched (upstream KMM's, say) does. Every piece of
    progress is in the cluster, so starting over in-process is safe and beats
    a crash loop: the caches are dropped and refilled from fresh listings.
    """
    while True:
        # Before kopf, not in a startup handler: the lists of a large fleet take seconds,
        # and kopf serves its health endpoint only once its startup handlers are done.
        # Every pass and finalizer waits for nodes_synced.
        await shared.start_informers()
        # The write clients' imports, on a thread while the lists come in.
        threading.Thread(target=shared.kube.warm, name="warm-clients", daemon=True).start()
        try:
            await kopf.operator(**operator_args)
            return
        except Exception as err:  # kopf's APINotFoundError is not public
            if getattr(err, "status", None) != 404:
                raise
            log.warning("a watched API went away (%s); restarting the watches", err)
            shared.forget()
