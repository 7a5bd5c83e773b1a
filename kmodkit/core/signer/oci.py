"""A small registry client for the signer: manifests and blobs, both ways.

The OCI distribution API over http.client (stdlib), with the parts the engine's
existence check already has (challenges, logins, TLS) taken from
``kmodkit.core.engine.registry``. Authentication is settled once per registry
before any request with a body: a ``GET /v2/`` answers with the challenge, and a
Bearer challenge's realm gives a token for all the scopes the signer will use
(``pull`` on the unsigned repository, ``pull,push`` on the signed one), so a
blob is never sent twice because the first try lacked a token. A 401 whose
challenge names scopes the token lacks gets one wider token; a mount the login
may not make (no pull on the source) becomes an upload.

Blob GETs follow redirects (registries hand blobs to object storage); a login
or token is only ever sent to the registry it belongs to, and HTTPS is never
left for plain HTTP unless the user chose plain HTTP. Messages name hosts,
repositories, users and HTTP statuses, never a password or a token.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from kmodkit.core.engine.registry import (
    MANIFEST_ACCEPT,
    Credentials,
    basic_auth,
    parse_challenges,
    redirect_target,
    token_in,
    url_host,
)
from kmodkit.core.signer.errors import SignerError

TIMEOUT_SECONDS = 120.0  # a socket read or write; a Job's activeDeadlineSeconds bounds the rest
MAX_REDIRECTS = 5
MAX_MANIFEST = 4 << 20  # the distribution spec's limit
MAX_CONFIG = 16 << 20
_CHUNK = 1 << 20
_MAX_ERROR_BODY = 64 << 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class RegistryError(SignerError):
    pass


class Reuse(Enum):
    """How a blob came to be in the target repository."""

    PRESENT = "present"  # it was there already
    MOUNTED = "mounted"  # linked from the unsigned image's repository, no bytes sent
    UPLOADED = "uploaded"


def uncovered_scopes(asked: Sequence[str], held: Sequence[str]) -> list[str]:
    """The scopes of ``asked`` that ``held`` does not grant. A scope is
    ``<type>:<name>:<actions>``; actions are a set (registries list ``push,pull`` or
    ``pull,push`` as they please), and one resource's actions may come from several scopes."""
    grants: dict[tuple[str, str], set[str]] = {}
    for scope in held:
        kind, name, actions = _scope(scope)
        grants.setdefault((kind, name), set()).update(actions)
    return [s for s in asked if not _scope(s)[2] <= grants.get(_scope(s)[:2], set())]


def _scope(scope: str) -> tuple[str, str, set[str]]:
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    return kind, name, {a for a in actions.split(",") if a}


@dataclass
class _Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    url: str


@dataclass
class Registry:
    """One registry host, with the login and TLS settings to reach it."""

    host: str
    login: Credentials | None
    context: ssl.SSLContext
    plain_http: bool  # the user chose plain HTTP (--insecure)
    scopes: tuple[str, ...]  # for a token: "repository:<name>:pull[,push]"
    login_source: str = "--docker-config"  # names where a refused login came from
    timeout: float = TIMEOUT_SECONDS
    _authorization: str | None = field(default=None, init=False, repr=False)
    _settled: bool = field(default=False, init=False)

    @property
    def base(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://{self.host}"

    # -- manifests -------------------------------------------------------------------

    def get_manifest(self, repository: str, reference: str) -> tuple[str, bytes, str]:
        """(Content-Type, body, digest) of a manifest; a digest reference is verified."""
        reply = self._call(
            "GET",
            f"/v2/{repository}/manifests/{reference}",
            {"Accept": MANIFEST_ACCEPT},
            limit=MAX_MANIFEST,
            what=f"manifest {repository}:{reference}",
        )
        if reply.status == 404:
            raise RegistryError(
                f"registry {self.host} has no image {repository}:{reference} "
                f"({_error_codes(reply)}); check the image name, or build and push it first"
            )
        self._expect(reply, (200,), f"fetching manifest {repository}:{reference}")
        digest = "sha256:" + hashlib.sha256(reply.body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"registry {self.host} sent manifest {repository}@{reference} with digest "
                f"{digest}; the registry or something between is corrupting content"
            )
        return reply.headers.get("Content-Type", ""), reply.body, digest

    def put_manifest(self, repository: str, tag: str, media_type: str, body: bytes) -> str:
        reply = self._call(
            "PUT",
            f"/v2/{repository}/manifests/{tag}",
            {"Content-Type": media_type},
            body=body,
            what=f"manifest {repository}:{tag}",
        )
        self._expect(reply, (200, 201), f"pushing manifest {repository}:{tag}")
        return "sha256:" + hashlib.sha256(body).hexdigest()

    # -- blobs -----------------------------------------------------------------------

    def get_blob(self, repository: str, digest: str, limit: int = MAX_CONFIG) -> bytes:
        reply = self._call(
            "GET", f"/v2/{repository}/blobs/{digest}", {}, limit=limit, what=f"blob {digest}"
        )
        self._expect(reply, (200,), f"fetching blob {digest} of {repository}")
        _verify(reply.body, digest, self.host)
        return reply.body

    def download_blob(self, repository: str, digest: str, size: int, into: Path) -> None:
        """Stream a blob into a file, checking its size and digest as it comes."""
        url = self.base + f"/v2/{repository}/blobs/{digest}"
        what = f"blob {digest} of {repository}"
        self._settle()
        for _ in range(MAX_REDIRECTS + 1):
            conn, response = self._open("GET", url, self._headers(url, {}), None, what)
            try:
                location = response.getheader("Location")
                if response.status in _REDIRECTS and location:
                    url = self._redirect(url, location, what)
                    continue
                if response.status != 200:
                    body = response.read(_MAX_ERROR_BODY)
                    self._expect(
                        _Reply(response.status, response.headers, body, url),
                        (200,),
                        f"fetching {what}",
                    )
                hasher, received = hashlib.sha256(), 0
                with into.open("wb") as out:
                    while chunk := response.read(_CHUNK):
                        hasher.update(chunk)
                        received += len(chunk)
                        out.write(chunk)
            except (OSError, http.client.HTTPException) as e:
                raise self._unreachable(url, e, what) from None
            finally:
                conn.close()
            if received != size or "sha256:" + hasher.hexdigest() != digest:
                raise RegistryError(
                    f"registry {self.host} sent {what} with another size or digest than its "
                    "manifest gives; the registry or something between is corrupting content"
                )
            return
        raise RegistryError(
            f"registry {self.host} redirected {what} more than {MAX_REDIRECTS} times"
        )

    def push_blob(
        self,
        repository: str,
        digest: str,
        size: int,
        source: Path | bytes,
        mount_from: str | None = None,
    ) -> Reuse:
        """Put a blob in ``repository``: found there, mounted from ``mount_from`` (a
        repository of this registry), or uploaded, in that order of preference."""
        what = f"blob {digest} to {repository}"
        head = self._call("HEAD", f"/v2/{repository}/blobs/{digest}", {}, what=what)
        if head.status == 200:
            return Reuse.PRESENT
        if head.status != 404:
            self._expect(head, (200, 404), f"checking {what}")
        start = None
        if mount_from:
            start = self._call(
                "POST",
                f"/v2/{repository}/blobs/uploads/",
                {"Content-Length": "0"},
                query={"mount": digest, "from": mount_from},
                body=b"",
                what=what,
                denied_ok=True,
            )
            if start.status == 201:
                return Reuse.MOUNTED
            if start.status in (401, 403):
                start = None  # no pull on the source for this login: upload instead
        if start is None:
            start = self._call(
                "POST",
                f"/v2/{repository}/blobs/uploads/",
                {"Content-Length": "0"},
                body=b"",
                what=what,
            )
        # 202: the registry would not mount (it may not share blobs between repositories)
        # and opened an upload instead.
        self._expect(start, (202,), f"starting the upload of {what}")
        location = start.headers.get("Location")
        if not location:
            raise RegistryError(f"registry {self.host} opened an upload without a Location")
        target = urllib.parse.urljoin(start.url, location)
        parts = urllib.parse.urlsplit(target)
        query_pairs = [*urllib.parse.parse_qsl(parts.query), ("digest", digest)]
        target = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query_pairs)))
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(source, bytes):
            done = self._call_url("PUT", target, headers, body=source, what=what)
        else:
            with source.open("rb") as stream:
                done = self._call_url("PUT", target, headers, body=stream, what=what)
        self._expect(done, (201,), f"uploading {what}")
        return Reuse.UPLOADED

    # -- the exchange ----------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        *,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        limit: int = _MAX_ERROR_BODY,
        what: str,
        denied_ok: bool = False,
    ) -> _Reply:
        url = self.base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        return self._call_url(
            method, url, headers, body=body, limit=limit, what=what, denied_ok=denied_ok
        )

    def _call_url(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        *,
        body: bytes | IO[bytes] | None = None,
        limit: int = _MAX_ERROR_BODY,
        what: str,
        denied_ok: bool = False,
    ) -> _Reply:
        """One request, redirects followed for GET and HEAD; a 401 is a refused login
        (or, with ``denied_ok``, the reply) once a wider token has been tried."""
        self._settle()
        widened = False
        for _ in range(MAX_REDIRECTS + 2):
            reply = self._exchange(method, url, self._headers(url, headers), body, limit, what)
            location = reply.headers.get("Location")
            if method in ("GET", "HEAD") and reply.status in _REDIRECTS and location:
                url = self._redirect(url, location, what)
                continue
            if reply.status == 401 and url_host(url) == self.host:
                if not widened and self._widen(reply):
                    widened = True
                    if not isinstance(body, bytes | None):
                        body.seek(0)
                    continue
                if denied_ok:
                    return reply
                raise self._refused(reply, what)
            return reply
        raise RegistryError(
            f"registry {self.host} redirected {what} more than {MAX_REDIRECTS} times"
        )

    def _headers(self, url: str, headers: Mapping[str, str]) -> dict[str, str]:
        sent = dict(headers)
        # The login or token belongs to this registry: a redirect target never sees it.
        if self._authorization and url_host(url) == self.host:
            sent["Authorization"] = self._authorization
        return sent

    def _settle(self) -> None:
        """Find how the registry authenticates, once, and get a token if it wants one."""
        if self._settled:
            return
        ping = self._exchange("GET", self.base + "/v2/", {}, None, _MAX_ERROR_BODY, "the API")
        self._settled = True
        if ping.status != 401:
            return  # 200: anonymous access; anything else shows on the first real request
        challenges = {
            c.scheme: c
            for c in parse_challenges(", ".join(ping.headers.get_all("WWW-Authenticate", [])))
        }
        bearer = challenges.get("bearer")
        if bearer is not None and bearer.params.get("realm"):
            self._authorization = f"Bearer {self._token(bearer.params)}"
        elif "basic" in challenges and self.login is not None:
            self._authorization = "Basic " + basic_auth(self.login)

    def _widen(self, reply: _Reply) -> bool:
        """Get a token that adds the scopes a Bearer challenge asks for (a mount asks for
        pull on its source too); False when it asks for nothing the token lacks."""
        challenges = parse_challenges(", ".join(reply.headers.get_all("WWW-Authenticate", [])))
        bearer = next((c for c in challenges if c.scheme == "bearer"), None)
        if bearer is None or not bearer.params.get("realm"):
            return False
        asked = [s for s in bearer.params.get("scope", "").split(" ") if s]
        missing = uncovered_scopes(asked, self.scopes)
        if not missing:
            return False
        self.scopes = (*self.scopes, *missing)
        self._authorization = f"Bearer {self._token(bearer.params)}"
        return True

    def _token(self, params: Mapping[str, str]) -> str:
        realm = params["realm"]
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("https", "http"):
            raise RegistryError(f"registry {self.host} names a token realm that is not a URL")
        login = self.login
        if parts.scheme == "http" and not self.plain_http:
            login = None  # never send a password in the clear to a realm the user did not choose
        query = [("service", params["service"])] if "service" in params else []
        query += [("scope", scope) for scope in self.scopes]
        headers = {"Authorization": "Basic " + basic_auth(login)} if login is not None else {}
        url = realm + ("&" if parts.query else "?") + urllib.parse.urlencode(query)
        reply = self._exchange("GET", url, headers, None, _MAX_ERROR_BODY, "a token")
        if reply.status in (401, 403):
            raise self._refused(reply, "a token", token_service=url_host(realm))
        if reply.status != 200:
            raise RegistryError(
                f"token service {url_host(realm)} of registry {self.host} answered HTTP "
                f"{reply.status}"
            )
        token = token_in(reply.body)
        if token is None:
            raise RegistryError(
                f"token service {url_host(realm)} of registry {self.host} answered without a token"
            )
        return token

    def _refused(self, reply: _Reply, what: str, token_service: str = "") -> RegistryError:
        where = (
            f"token service {token_service} of registry {self.host}"
            if token_service
            else (f"registry {self.host}")
        )
        if self.login is None:
            return RegistryError(
                f"{where} requires a login for {what} and {self.login_source} has none for "
                f"{self.host}; add one (a kubernetes.io/dockerconfigjson Secret)"
            )
        return RegistryError(
            f"{where} refused the login of user {self.login.username!r} from "
            f"{self.login_source} (HTTP {reply.status}, {what}); check its password"
        )

    def _expect(self, reply: _Reply, statuses: tuple[int, ...], doing: str) -> None:
        if reply.status in statuses:
            return
        if reply.status == 403:
            user = f"user {self.login.username!r}" if self.login else "anonymous access"
            raise RegistryError(
                f"registry {self.host} denied {doing} to {user} (HTTP 403, "
                f"{_error_codes(reply)}); grant it pull and push on the repositories"
            )
        raise RegistryError(
            f"registry {self.host} answered HTTP {reply.status} {doing} ({_error_codes(reply)})"
        )

    def _redirect(self, url: str, location: str, what: str) -> str:
        target, scheme = redirect_target(url, location, self.plain_http)
        if target is None:
            raise RegistryError(
                f"registry {self.host} redirected {what} to a {scheme or 'relative'} address; "
                "only HTTPS is followed unless plain HTTP was chosen (--insecure)"
            )
        return target

    def _exchange(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | IO[bytes] | None,
        limit: int,
        what: str,
    ) -> _Reply:
        conn, response = self._open(method, url, headers, body, what)
        try:
            data = response.read(limit) if method != "HEAD" else b""
        except (OSError, http.client.HTTPException) as e:
            raise self._unreachable(url, e, what) from None
        finally:
            conn.close()
        return _Reply(response.status, response.headers, data, url)

    def _open(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | IO[bytes] | None,
        what: str,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        parts = urllib.parse.urlsplit(url)
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.timeout, context=self.context
            )
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self.timeout)
        )
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, target, body, {"User-Agent": "kmodkit-sign", **headers})
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise self._unreachable(url, e, what) from None

    def _unreachable(self, url: str, e: BaseException, what: str) -> RegistryError:
        host = url_host(url)
        where = f"registry {host}" if host == self.host else f"{host} (for registry {self.host})"
        if isinstance(e, ssl.SSLCertVerificationError):
            return RegistryError(
                f"cannot verify the TLS certificate of {where}: {e.verify_message}; give its "
                "CA in KMODKIT_REGISTRY_CA, or skip the check for this registry "
                "(--skip-tls-verify for --image, --skip-tls-verify-pull for --unsigned-image)"
            )
        if isinstance(e, ssl.SSLError):
            return RegistryError(
                f"cannot talk TLS to {where} ({what}): {e.reason or type(e).__name__}; if it "
                "serves plain HTTP, choose that for it (--insecure for --image, "
                "--insecure-pull for --unsigned-image)"
            )
        if isinstance(e, TimeoutError):
            return RegistryError(f"{where} did not answer within {self.timeout:g}s ({what})")
        reason = getattr(e, "strerror", None) or type(e).__name__
        return RegistryError(f"cannot reach {where} ({what}): {reason}")


def _verify(body: bytes, digest: str, host: str) -> None:
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise RegistryError(
            f"registry {host} sent blob {digest} with another digest; the registry or "
            "something between is corrupting content"
        )


def _error_codes(reply: _Reply) -> str:
    """The codes of a distribution error body (``{"errors": [{"code": ...}]}``), which name
    what went wrong without echoing the request."""
    try:
        errors: Any = json.loads(reply.body).get("errors")
        codes = [str(e["code"]) for e in errors if isinstance(e, dict) and "code" in e]
    except (ValueError, AttributeError, TypeError):
        codes = []
    return ", ".join(codes) or "no error code"
