"""Does an image exist? Asked of the registry itself (OCI distribution API).

KMM asks the kubelet to pull the image, so the node's cache and architecture
decide and ``registryTLS`` is ignored. kmodkit sends a manifest HEAD with the
Module's pull secret, honouring ``registryTLS``: plain HTTP for ``insecure``,
no certificate check for ``insecureSkipTLSVerify``, verified TLS otherwise
(the system's CAs plus ``KMODKIT_REGISTRY_CA``).

The client is small and stdlib-only so that every exchange is bounded: one
total deadline per check, no retries inside it (a failure is an UNKNOWN answer
and AnswerCache backs off), redirects followed a few hops, and the token flow
of the distribution spec (``WWW-Authenticate: Bearer realm=...``) done with or
without credentials, since public images on Docker Hub, GHCR, quay and nvcr
still need an anonymous token. Registries that challenge with Basic get basic
auth.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from kmodkit.core.api import RegistryTLS
from kmodkit.core.engine.images import DOCKER_HUB, DOCKER_HUB_NAMES, parse_image_reference

DEFAULT_TIMEOUT_SECONDS = 5.0
MAX_REDIRECTS = 5
_MAX_BODY = 1 << 20  # a token response is a few KiB; never read a stranger's stream whole
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
MANIFEST_ACCEPT = ", ".join(  # every manifest kind kmodkit reads, for an Accept header
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_SECRET_HINT = (
    "recreate it with `kubectl create secret docker-registry` or fix the key so it holds "
    "base64 of Docker's config JSON"
)


class Existence(Enum):
    EXISTS = "Exists"
    MISSING = "Missing"
    UNKNOWN = "Unknown"  # the registry could not be asked; never treated as missing


@dataclass(frozen=True)
class Answer:
    existence: Existence
    detail: str = ""  # why, for UNKNOWN; never carries a credential


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Credentials(username={self.username!r}, password=***)"


# -- pull secrets --------------------------------------------------------------


@dataclass(frozen=True)
class PullSecret:
    """The logins of a Module's ``imageRepoSecret``, or why it cannot be used."""

    name: str = ""  # namespace/name
    logins: Mapping[str, Credentials] = field(default_factory=dict)  # registry host → login
    problem: str = ""  # set when the Secret is malformed: what is wrong and what to do

    def credentials_for(self, host: str) -> Credentials | None:
        host = host.lower()
        if host == DOCKER_HUB:
            return next(
                (self.logins[h] for h in sorted(DOCKER_HUB_NAMES) if h in self.logins), None
            )
        return self.logins.get(host)


def read_pull_secret(name: str, data: Mapping[str, str]) -> PullSecret:
    """Logins from a Secret's ``data``: ``.dockerconfigjson`` (``{"auths": {...}}``) or the
    older ``.dockercfg`` (the same map of registry → login, without ``auths``)."""
    for key, nested in ((".dockerconfigjson", True), (".dockercfg", False)):
        if key in data:
            try:
                return PullSecret(name, _logins(data[key], nested))
            except ValueError as e:
                return PullSecret(
                    name, problem=f"pull secret {name} is malformed: {key} {e}; {_SECRET_HINT}"
                )
    return PullSecret(
        name,
        problem=f"pull secret {name} is malformed: it has neither a .dockerconfigjson nor a "
        ".dockercfg key; make it a kubernetes.io/dockerconfigjson Secret "
        "(`kubectl create secret docker-registry`)",
    )


def _logins(encoded: str, nested: bool) -> dict[str, Credentials]:
    try:
        text = base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("is not base64 of UTF-8 text") from None
    return parse_docker_config(text, nested)


def parse_docker_config(text: str, nested: bool = True) -> dict[str, Credentials]:
    """The logins (registry host → login) of a Docker config JSON: ``{"auths": {...}}``, or
    without ``nested`` the older ``.dockercfg`` map. Raises ValueError saying what is wrong,
    to be prefixed with the file or key it came from."""
    # Messages name keys and positions only: never a byte of the config's content.
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if nested:
        if not isinstance(config, dict) or not isinstance(config.get("auths", {}), dict):
            raise ValueError('is not a JSON object with an "auths" object')
        config = config.get("auths", {})
    elif not isinstance(config, dict):
        raise ValueError("is not a JSON object of registry → login")
    logins: dict[str, Credentials] = {}
    for server, entry in config.items():
        if not isinstance(entry, dict):
            raise ValueError(f"has a login for {server!r} that is not a JSON object")
        host = server.removeprefix("https://").removeprefix("http://").split("/", 1)[0].lower()
        login = _login(server, entry)
        if login is not None:
            logins.setdefault(host, login)
    return logins


def _login(server: str, entry: Mapping[str, object]) -> Credentials | None:
    username, password = entry.get("username"), entry.get("password")
    if username and password:
        return Credentials(str(username), str(password))
    auth = entry.get("auth")
    if not auth:
        return None  # e.g. only an email or an identity token: no login kmodkit can use
    try:
        user, colon, secret = base64.b64decode(str(auth), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        colon = ""
    if not colon:
        raise ValueError(f'has an "auth" for {server!r} that is not base64 of user:password')
    return Credentials(user, secret)


# -- WWW-Authenticate ------------------------------------------------------------

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM_RE = re.compile(rf'\s*({_TOKEN})\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]*)\s*,?')
_SCHEME_RE = re.compile(rf"\s*,?\s*({_TOKEN})(?=[\s,]|$)")


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lower case: "bearer", "basic"
    params: Mapping[str, str]  # names in lower case


def parse_challenges(header: str) -> list[Challenge]:
    """The challenges of a ``WWW-Authenticate`` value (RFC 9110 §11.6.1)."""
    found: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while pos < len(header):
        param = _PARAM_RE.match(header, pos)
        if param and found:
            value = param[2]
            if value.startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            found[-1][1][param[1].lower()] = value
            pos = param.end()
            continue
        scheme = _SCHEME_RE.match(header, pos)
        if scheme is None:
            break
        found.append((scheme[1].lower(), {}))
        pos = scheme.end()
    return [Challenge(s, p) for s, p in found]


# -- TLS ---------------------------------------------------------------------------


def tls_flags(tls: RegistryTLS | None, push: bool) -> list[str]:
    """``registryTLS`` as the flags kmodkit-build and kmodkit-sign take (kaniko's), for pushing
    or pulling."""
    if tls is None:
        return []
    suffix = "" if push else "-pull"
    flags = []
    if tls.insecure:
        flags.append(f"--insecure{suffix}")
    if tls.insecure_skip_tls_verify:
        flags.append(f"--skip-tls-verify{suffix}")
    return flags


def ssl_context(tls: RegistryTLS | None, ca_bundle: str | None) -> ssl.SSLContext:
    """The system's trust store, plus ``ca_bundle`` (a private registry's CA) if given:
    adding it must not stop public registries from verifying."""
    context = ssl.create_default_context()
    if tls is not None and tls.insecure_skip_tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_bundle:
        context.load_verify_locations(cafile=ca_bundle)
    return context


# -- one check ---------------------------------------------------------------------


class _Unreachable(Exception):
    """The registry could not be asked; the message is the Answer's detail."""


def check(
    image: str,
    credentials: Credentials | None,
    tls: RegistryTLS | None,
    ca_bundle: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> Answer:
    """Ask the registry whether ``image`` exists, within ``timeout`` seconds in all.

    Anything but a clear yes or no (network, TLS, auth, 5xx, the deadline) is UNKNOWN.
    """
    ref = parse_image_reference(image)
    host = ref.registry
    try:
        context = ssl_context(tls, ca_bundle)
    except (OSError, ssl.SSLError) as e:
        return Answer(
            Existence.UNKNOWN,
            f"cannot load the registry CA bundle {ca_bundle} (KMODKIT_REGISTRY_CA): "
            f"{e.strerror or type(e).__name__}",
        )
    scheme = "http" if tls is not None and tls.insecure else "https"
    url = f"{scheme}://{host}/v2/{ref.repository}/manifests/{ref.digest or ref.tag}"
    session = _Session(host, credentials, context, scheme == "http", timeout)
    try:
        status, answered_by = session.head_manifest(url)
    except _Unreachable as e:
        return Answer(Existence.UNKNOWN, str(e))
    if status in (401, 403) and answered_by != host:
        return Answer(
            Existence.UNKNOWN,
            f"registry {host} redirected to {answered_by}, which requires authentication; "
            "imageRepoSecret logins are sent only to the registry the image names",
        )
    return answer_for(status, host, credentials is not None)


def answer_for(status: int, host: str, had_credentials: bool) -> Answer:
    """What the final HTTP status of a manifest HEAD says about the image."""
    if status == 200:
        return Answer(Existence.EXISTS)
    if status == 404:
        return Answer(Existence.MISSING)
    if status in (401, 403):
        why = (
            "the credentials in imageRepoSecret were refused"
            if had_credentials
            else "no credentials for it in imageRepoSecret"
        )
        return Answer(Existence.UNKNOWN, f"registry {host} requires authentication and {why}")
    return Answer(Existence.UNKNOWN, f"registry {host} answered HTTP {status}")


@dataclass
class _Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


@dataclass
class _Session:
    """The exchanges of one check: redirects, challenges, one deadline for all of them."""

    registry: str
    credentials: Credentials | None
    context: ssl.SSLContext
    plain_http: bool  # registryTLS.insecure: the user chose plain HTTP for this registry
    timeout: float
    deadline: float = field(init=False)
    authorization: dict[str, str] = field(default_factory=dict)  # host → Authorization

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def head_manifest(self, url: str) -> tuple[int, str]:
        """The final status of a manifest HEAD, and the host that gave it."""
        challenged: set[str] = set()
        for _ in range(MAX_REDIRECTS + 1):
            here = url_host(url)
            headers = {"Accept": MANIFEST_ACCEPT}
            if here in self.authorization:
                headers["Authorization"] = self.authorization[here]
            response = self._request("HEAD", url, headers)
            location = response.headers.get("Location")
            if response.status in _REDIRECTS and location:
                url = self._redirect(url, location)
                continue
            if response.status == 401 and here not in challenged:
                challenged.add(here)
                # A login belongs to its registry: a redirect target never sees it.
                login = self.credentials if here == self.registry else None
                authorization = self._authorize(response, login, url)
                if authorization is not None:
                    self.authorization[here] = authorization
                    continue
            return response.status, here
        raise _Unreachable(f"registry {self.registry} redirected more than {MAX_REDIRECTS} times")

    def _redirect(self, url: str, location: str) -> str:
        target, scheme = redirect_target(url, location, self.plain_http)
        if target is None:
            raise _Unreachable(
                f"registry {self.registry} redirected to a {scheme or 'relative'} address; "
                "only HTTPS is followed unless registryTLS.insecure is set"
            )
        return target

    def _authorize(self, response: _Response, login: Credentials | None, url: str) -> str | None:
        """The Authorization that answers this 401's challenge, or None if there is none."""
        challenges = {
            c.scheme: c
            for c in parse_challenges(", ".join(response.headers.get_all("WWW-Authenticate", [])))
        }
        if "bearer" in challenges and challenges["bearer"].params.get("realm"):
            token = self._token(challenges["bearer"], login, url)
            return None if token is None else f"Bearer {token}"
        if "basic" in challenges and login is not None:
            return "Basic " + basic_auth(login)
        return None

    def _token(self, challenge: Challenge, login: Credentials | None, url: str) -> str | None:
        """A token from the challenge's realm; None when the realm refuses the login."""
        realm = challenge.params["realm"]
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("https", "http"):
            raise _Unreachable(f"registry {self.registry} names a token realm that is not a URL")
        if parts.scheme == "http" and not self.plain_http:
            login = None  # never send a password in the clear to a realm the user did not choose
        query = [("service", challenge.params["service"])] if "service" in challenge.params else []
        query.append(("scope", challenge.params.get("scope") or _pull_scope(url)))
        sep = "&" if parts.query else "?"
        headers = {"Authorization": "Basic " + basic_auth(login)} if login is not None else {}
        response = self._request("GET", realm + sep + urllib.parse.urlencode(query), headers)
        if response.status in (401, 403):
            return None
        if response.status != 200:
            raise _Unreachable(
                f"token service {url_host(realm)} of registry {self.registry} answered "
                f"HTTP {response.status}"
            )
        token = token_in(response.body)
        if token is None:
            raise _Unreachable(
                f"token service {url_host(realm)} of registry {self.registry} answered "
                "without a token"
            )
        return token

    def _request(self, method: str, url: str, headers: Mapping[str, str]) -> _Response:
        parts = urllib.parse.urlsplit(url)
        where = (
            f"registry {url_host(url)}"
            if url_host(url) == self.registry
            else f"{url_host(url)} (for registry {self.registry})"
        )
        timed_out = _Unreachable(f"{where} did not answer within {self.timeout:g}s")
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out
        port = parts.port
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(
                parts.hostname or "", port, timeout=remaining, context=self.context
            )
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.hostname or "", port, timeout=remaining)
        )
        # A socket timeout bounds each read, not the exchange: a registry that trickles a
        # byte at a time would hold the pass for ever. Cutting the socket at the deadline
        # bounds the whole of it.
        cut = threading.Event()
        cutter = threading.Timer(remaining, _cut, (conn, cut))
        cutter.daemon = True
        cutter.start()
        try:
            conn.request(
                method, parts.path + (f"?{parts.query}" if parts.query else ""), None, dict(headers)
            )
            response = conn.getresponse()
            body = response.read(_MAX_BODY) if method != "HEAD" else b""
        except ssl.SSLCertVerificationError as e:
            raise _Unreachable(
                f"cannot verify the TLS certificate of {where}: {e.verify_message}; give its CA "
                "in KMODKIT_REGISTRY_CA or set registryTLS"
            ) from None
        except (OSError, http.client.HTTPException) as e:
            if isinstance(e, TimeoutError) or cut.is_set():
                raise timed_out from None
            reason = getattr(e, "strerror", None) or type(e).__name__
            raise _Unreachable(f"cannot reach {where}: {reason}") from None
        finally:
            cutter.cancel()
            conn.close()
        if cut.is_set():
            # A cut often reads as the end of the answer, not as an error: half an answer
            # (a status line, no end of headers) must not pass for one.
            raise timed_out
        return _Response(response.status, response.headers, body)


def redirect_target(url: str, location: str, plain_http: bool) -> tuple[str | None, str]:
    """Where a redirect from ``url`` leads, and its scheme; None for a scheme not followed
    (only HTTPS, and plain HTTP where the user chose it)."""
    target = urllib.parse.urljoin(url, location)
    scheme = urllib.parse.urlsplit(target).scheme
    followed = scheme == "https" or (scheme == "http" and plain_http)
    return (target if followed else None), scheme


def token_in(body: bytes) -> str | None:
    """The token of a token service's answer (``token`` or OAuth's ``access_token``)."""
    try:
        reply = json.loads(body)
        token = reply.get("token") or reply.get("access_token")
    except (ValueError, AttributeError):
        return None
    return token if isinstance(token, str) and token else None


def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    cut.set()
    sock = conn.sock
    if sock is not None:
        # The plain socket's shutdown, also under TLS: it wakes a blocked read at once.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def url_host(url: str) -> str:
    """host[:port] of ``url``."""
    # Without any user:password@ a redirect or realm might carry: it names
    # hosts in details and keys the Authorization kept per host.
    return urllib.parse.urlsplit(url).netloc.rpartition("@")[2]


def basic_auth(login: Credentials) -> str:
    """The credentials part of a ``Basic`` Authorization header."""
    return base64.b64encode(f"{login.username}:{login.password}".encode()).decode()


def _pull_scope(url: str) -> str:
    # /v2/<repository>/manifests/<reference>: the repository may hold slashes.
    path = urllib.parse.urlsplit(url).path.removeprefix("/v2/")
    repository = path.rsplit("/manifests/", 1)[0]
    return f"repository:{repository}:pull"


# -- the cache -----------------------------------------------------------------------


def unknown_ttl(failures: int, base: float, cap: float) -> float:
    """How long the ``failures``-th UNKNOWN in a row is kept: doubling from ``base``."""
    return min(base * 2.0 ** max(failures - 1, 0), cap)


class AnswerCache:
    """Recent answers, so one reconcile pass over many nodes asks once per image.

    EXISTS answers are kept for long. A missing image is re-checked soon, because
    a build or a push may land at any moment. UNKNOWN answers back off: each one
    in a row for the same image is kept twice as long as the last (from
    ``other_ttl``, at most ``unknown_cap``), so a registry that is down or slow is
    not asked, and waited on, every pass. Passes of different Modules run in
    threads and share one cache, hence the lock.
    """

    def __init__(
        self, exists_ttl: float = 600.0, other_ttl: float = 20.0, unknown_cap: float = 600.0
    ) -> None:
        self._exists_ttl = exists_ttl
        self._other_ttl = other_ttl
        self._unknown_cap = unknown_cap
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, float, Answer]] = {}
        self._failures: dict[tuple[str, str], int] = {}

    def get(self, key: tuple[str, str], now: float | None = None) -> Answer | None:
        now = time.monotonic() if now is None else now
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            at, ttl, answer = hit
            if now - at > ttl:
                del self._entries[key]
                return None
            return answer

    def put(self, key: tuple[str, str], answer: Answer, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            if answer.existence is Existence.UNKNOWN:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                ttl = unknown_ttl(failures, self._other_ttl, self._unknown_cap)
            else:
                self._failures.pop(key, None)
                ttl = self._exists_ttl if answer.existence is Existence.EXISTS else self._other_ttl
            self._entries[key] = (now, ttl, answer)
