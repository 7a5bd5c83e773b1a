"""A loopback proxy in front of the devcluster's apiserver that can hold requests back
or let a test meddle with them.

Tests point the operator at it to make a race deterministic: requests whose
path matches a held prefix (``/api/v1/nodes``, say) wait until released, so
"the operator's first pass runs before it has seen every node" happens every
time instead of by luck. An ``Interceptor`` sees every request: it may answer
one itself (a fault), cut a stream short, and hear of each answer before the
client does (to kill the client at that very point). The proxy can listen on
several ports, one per client, so the interceptor knows who asked. Everything
else passes straight through, streams (watches) included. It serves with the
cluster's own serving certificate (its SANs are 127.0.0.1 and localhost), so
clients keep verifying TLS against the cluster CA; the client's bearer token is
passed on unchanged.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from aiohttp import ClientPayloadError, ClientSession, ClientTimeout, TCPConnector, web

from kmodkit_dev import procs

# Hop-by-hop headers, and those the proxy's own framing replaces.
_DROPPED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}


class Interceptor(Protocol):
    def answer(self, listener: int, request: web.Request, body: bytes) -> web.Response | None:
        """A response to give instead of the apiserver's, or None to forward the request."""

    def stream_limit(self, listener: int, request: web.Request) -> float | None:
        """Seconds after which to cut this (streaming) response, or None for never."""

    def answered(self, listener: int, request: web.Request, body: bytes, status: int) -> None:
        """Called once the apiserver answered, before the client gets the answer."""


class ApiProxy:
    def __init__(
        self,
        upstream: str,
        pki: Path,
        held: tuple[str, ...],
        listeners: int = 1,
        interceptor: Interceptor | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.ports = [procs.free_port() for _ in range(listeners)]
        self._pki = pki
        self._held = held
        self._interceptor = interceptor
        self._released = threading.Event()
        self.held_requests = 0
        """Requests that had to wait (a test asserts the hold was exercised)."""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return self.url_of(0)

    def url_of(self, listener: int) -> str:
        return f"https://127.0.0.1:{self.ports[listener]}"

    def release(self) -> None:
        self._released.set()

    def kubeconfig(self, original: Path, target: Path, listener: int = 0) -> Path:
        """A copy of ``original`` whose server is this proxy (one of its listeners)."""
        config = json.loads(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.url_of(listener)
        target.write_text(json.dumps(config))
        target.chmod(0o600)
        return target

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the API proxy did not start")

    def stop(self) -> None:
        self._released.set()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        upstream_tls = ssl.create_default_context(cafile=str(self._pki / "ca.crt"))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(self._pki / "serving.crt", self._pki / "serving.key")
        async with ClientSession(
            connector=TCPConnector(ssl=upstream_tls),
            timeout=ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        ) as session:
            runners = []
            for listener, port in enumerate(self.ports):
                app = web.Application()

                async def forward(request: web.Request, listener: int = listener) -> Any:
                    return await self._forward(session, listener, request)

                app.router.add_route("*", "/{tail:.*}", forward)
                runner = web.AppRunner(app)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port, ssl_context=serving).start()
                runners.append(runner)
            self._ready.set()
            await self._stop.wait()
            for runner in runners:
                await runner.cleanup()

    async def _forward(
        self, session: ClientSession, listener: int, request: web.Request
    ) -> web.StreamResponse:
        if request.path.startswith(self._held) and not self._released.is_set():
            self.held_requests += 1
            while not self._released.is_set():
                await asyncio.sleep(0.05)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        body = await request.read()
        meddler = self._interceptor
        if meddler is not None and (fault := meddler.answer(listener, request, body)):
            return fault
        limit = meddler.stream_limit(listener, request) if meddler else None
        async with session.request(
            request.method,
            f"{self.upstream}{request.path_qs}",
            headers=headers,
            data=body or None,
            allow_redirects=False,
            # As sent: the apiserver reads a body without Content-Type as JSON, and
            # refuses the application/octet-stream aiohttp would otherwise add.
            skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"),
        ) as upstream:
            if meddler is not None:
                meddler.answered(listener, request, body, upstream.status)
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED},
            )
            await response.prepare(request)
            try:
                async with asyncio.timeout(limit):
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
            except TimeoutError:
                return response  # cut: the client sees its stream end early
            except (ConnectionResetError, ClientPayloadError):
                # The client went away (killed, or done with a watch), or the apiserver
                # did (restarted): either way the stream ends here.
                return response
            await response.write_eof()
            return response


@contextmanager
def api_proxy(
    upstream: str,
    pki: Path,
    held: tuple[str, ...] = (),
    listeners: int = 1,
    interceptor: Interceptor | None = None,
) -> Iterator[ApiProxy]:
    proxy = ApiProxy(upstream, pki, held, listeners, interceptor)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def server_of(kubeconfig: Path) -> str:
    config: dict[str, Any] = json.loads(kubeconfig.read_text())
    return str(config["clusters"][0]["cluster"]["server"])
