"""Loopback HTTPS servers that stand in front of the test registry.

One server plays what the registry client meets in the wild: a proxy that
passes requests through (and counts them), a registry that answers 5xx, one
that stalls or trickles its answer a byte at a time, and a front that
redirects to the real registry under another path, as registry.k8s.io does.
They listen on 127.0.0.1 only and forward only to the registry they are given.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_FORWARDED = ("Accept", "Authorization")
USERINFO_PASSWORD = "in-the-location"
_RETURNED = ("Www-Authenticate", "Docker-Content-Digest", "Content-Type", "Location")


class Mode(Enum):
    PROXY = "proxy"  # pass to the registry
    STATUS = "status"  # answer ``status`` at once
    STALL = "stall"  # accept, never answer
    TRICKLE = "trickle"  # start an answer, then one byte every 0.2 s
    REDIRECT = "redirect"  # 307 to the registry, the repository under ``prefix``
    REDIRECT_HTTP = "redirect-http"  # 307 to a plain-HTTP address
    LOOP = "loop"  # 307 to itself
    REDIRECT_USERINFO = "redirect-userinfo"  # 307 to user:password@``upstream``


@dataclass
class Front:
    host: str  # host:port to name in image references
    upstream: str  # the registry's host:port
    mode: Mode = Mode.PROXY
    status: int = 503
    prefix: str = ""
    requests: int = 0
    released: threading.Event = field(default_factory=threading.Event)
    server: ThreadingHTTPServer | None = None

    def stop(self) -> None:
        self.released.set()  # frees stalled handlers
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def start(cert: Path, key: Path, upstream: str, upstream_ca: Path) -> Front:
    """Serve with ``cert``/``key``; reach ``upstream`` verifying ``upstream_ca``."""
    upstream_tls = ssl.create_default_context(cafile=str(upstream_ca))
    front = Front(host="", upstream=upstream)

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self._answer()

        def do_GET(self) -> None:
            self._answer()

        def _answer(self) -> None:
            front.requests += 1
            mode = front.mode
            if mode is Mode.PROXY:
                self._proxy()
            elif mode is Mode.STATUS:
                self._reply(front.status)
            elif mode is Mode.STALL:
                front.released.wait(60)
            elif mode is Mode.TRICKLE:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                deadline = time.monotonic() + 60
                while not front.released.is_set() and time.monotonic() < deadline:
                    self.wfile.write(b"a")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif mode is Mode.REDIRECT:
                path = self.path.replace("/v2/", f"/v2/{front.prefix}", 1)
                self._reply(307, {"Location": f"https://{front.upstream}{path}"})
            elif mode is Mode.REDIRECT_USERINFO:
                location = f"https://user:{USERINFO_PASSWORD}@{front.upstream}{self.path}"
                self._reply(307, {"Location": location})
            elif mode is Mode.REDIRECT_HTTP:
                self._reply(307, {"Location": f"http://{front.upstream}{self.path}"})
            else:
                self._reply(307, {"Location": self.path})

        def _proxy(self) -> None:
            conn = http.client.HTTPSConnection(front.upstream, context=upstream_tls, timeout=10)
            try:
                headers = {k: v for k in _FORWARDED if (v := self.headers.get(k)) is not None}
                conn.request(self.command, self.path, headers=headers)
                response = conn.getresponse()
                body = response.read()
                self._reply(
                    response.status,
                    {k: v for k in _RETURNED if (v := response.getheader(k)) is not None},
                    body,
                )
            finally:
                conn.close()

        def _reply(
            self, status: int, headers: dict[str, str] | None = None, body: bytes = b""
        ) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    front.server = server
    front.host = f"127.0.0.1:{server.server_address[1]}"
    return front
