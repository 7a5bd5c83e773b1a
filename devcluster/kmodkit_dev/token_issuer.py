"""A token issuer for the test registry: the docker token-auth flow, on loopback.

The registry (``auth: token``) answers ``401`` with ``WWW-Authenticate: Bearer
realm=<this issuer>,service=...,scope=...``; a client asks this issuer for a
token, with basic credentials or none, and retries with it. As on Docker Hub
and GHCR, a request without credentials still gets a token: it grants ``pull``
on the anonymous repositories and nothing elsewhere, so the registry answers a
private repository with 401 again. Tokens are RS256 JWTs carrying the signing
certificate (``x5c``); that certificate is the registry's ``rootcertbundle``.
openssl signs, so the harness needs no JWT library.
"""

from __future__ import annotations

import base64
import hmac
import json
import ssl
import subprocess
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SERVICE = "kmodkit-test-registry"
ISSUER = "kmodkit-test-issuer"


@dataclass
class TokenIssuer:
    url: str  # the realm
    certificate: Path  # the registry's rootcertbundle
    server: ThreadingHTTPServer
    requests: list[tuple[str | None, list[str]]] = field(default_factory=list)
    """(user or None for anonymous, scopes asked) of every token request, in order."""

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start(
    workdir: Path,
    username: str,
    password: str,
    anonymous: tuple[str, ...],
    serving_cert: Path,
    serving_key: Path,
) -> TokenIssuer:
    """Serve tokens over HTTPS on a free loopback port; ``anonymous`` are repository
    prefixes anyone may pull."""
    workdir.mkdir(parents=True, exist_ok=True)
    key, cert = workdir / "token.key", workdir / "token.crt"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-subj", "/CN=kmodkit-token-issuer", "-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
        )  # fmt: skip
    x5c = "".join(
        line for line in cert.read_text().splitlines() if line and not line.startswith("-----")
    )
    issued: list[tuple[str | None, list[str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            scopes = [s for value in query.get("scope", []) for s in value.split(" ") if s]
            user = _basic_user(self.headers.get("Authorization", ""), username, password)
            if user is None:
                self._reply(401, {"details": "incorrect username or password"})
                return
            issued.append((user or None, scopes))
            access = [
                grant
                for scope in scopes
                if (grant := _grant(scope, bool(user), anonymous)) is not None
            ]
            token = _jwt(key, x5c, user or "", query.get("service", [""])[0], access)
            self._reply(200, {"token": token, "access_token": token, "expires_in": 300})

        def _reply(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: pytest shows failures, not every token request

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(serving_cert, serving_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    return TokenIssuer(f"https://127.0.0.1:{port}/token", cert, server, issued)


def _basic_user(header: str, username: str, password: str) -> str | None:
    """The user a Basic header proves, "" for no header, None for a wrong login."""
    if not header:
        return ""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    user, _, given = base64.b64decode(encoded).decode().partition(":")
    ok = hmac.compare_digest(user, username) and hmac.compare_digest(given, password)
    return user if ok else None


def _grant(scope: str, authenticated: bool, anonymous: tuple[str, ...]) -> dict[str, object] | None:
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    asked = [a for a in actions.split(",") if a]
    if kind != "repository" or not name:
        return None
    if authenticated:
        # Everything, whatever was asked: oras-py (the harness's pusher) reuses its first
        # token, a pull-only one, for the push that follows.
        allowed = ["pull", "push"]
    elif name.startswith(anonymous):
        allowed = [a for a in asked if a == "pull"]
    else:
        allowed = []
    return {"type": kind, "name": name, "actions": allowed}


def _jwt(key: Path, x5c: str, subject: str, service: str, access: list[dict[str, object]]) -> str:
    now = int(time.time())
    header = {"typ": "JWT", "alg": "RS256", "x5c": [x5c]}
    claims = {
        "iss": ISSUER,
        "sub": subject,
        "aud": service or SERVICE,
        "exp": now + 300,
        "nbf": now - 10,
        "iat": now,
        "jti": uuid.uuid4().hex,
        "access": access,
    }
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", str(key)],
        input=signing_input.encode(),
        check=True,
        capture_output=True,
    ).stdout
    return f"{signing_input}.{_b64(signature)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
