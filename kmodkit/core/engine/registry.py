"""Does an image exist? Asked of the registry itself (OCI distribution API).

KMM asks the kubelet to pull the image, so the node's cache and architecture
decide and ``registryTLS`` is ignored. kmodkit sends a manifest HEAD with the
Module's pull secret, honouring ``registryTLS``: plain HTTP for ``insecure``,
no certificate check for ``insecureSkipTLSVerify``, verified TLS otherwise.
The ORAS client does the token dance (bearer realms and scopes); registries
that answer with a Basic challenge get basic auth.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from kmodkit.core.api import RegistryTLS
from kmodkit.core.engine.images import ImageReference, parse_image_reference

DOCKER_HUB = "registry-1.docker.io"
_DOCKER_HUB_ALIASES = ("docker.io", "index.docker.io", DOCKER_HUB)
_MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
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


def registry_host(ref: ImageReference) -> str:
    return DOCKER_HUB if ref.domain in ("", *_DOCKER_HUB_ALIASES) else ref.domain


def credentials_for(dockerconfigjson: str | bytes, host: str) -> Credentials | None:
    """Credentials for ``host`` from a kubernetes.io/dockerconfigjson Secret body."""
    try:
        auths = json.loads(dockerconfigjson).get("auths", {})
    except (ValueError, AttributeError):
        return None
    wanted = {host} | (set(_DOCKER_HUB_ALIASES) if host == DOCKER_HUB else set())
    for key, entry in auths.items():
        server = key.removeprefix("https://").removeprefix("http://").split("/", 1)[0]
        if server not in wanted or not isinstance(entry, Mapping):
            continue
        if entry.get("username") and entry.get("password"):
            return Credentials(str(entry["username"]), str(entry["password"]))
        if entry.get("auth"):
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            return Credentials(user, password)
    return None


def check(
    image: str,
    credentials: Credentials | None,
    tls: RegistryTLS | None,
    ca_bundle: str | None = None,
    timeout: float = 15.0,
) -> Answer:
    """Ask the registry whether ``image`` exists; network or auth trouble is UNKNOWN."""
    import oras.provider
    import requests

    ref = parse_image_reference(image)
    host = registry_host(ref)
    insecure = bool(tls and tls.insecure)
    verify: bool | str = not (tls and tls.insecure_skip_tls_verify)
    if verify and ca_bundle:
        verify = ca_bundle
    scheme = "http" if insecure else "https"
    url = f"{scheme}://{host}/v2/{_repository(ref)}/manifests/{ref.digest or ref.tag}"
    headers = {"Accept": _MANIFEST_TYPES}
    try:
        first = requests.head(url, headers=headers, verify=verify, timeout=timeout)
        response = first
        if first.status_code in (401, 403) and credentials is not None:
            challenge = first.headers.get("Www-Authenticate", "")
            backend = "basic" if challenge.lower().startswith("basic") else "token"
            client = oras.provider.Registry(
                hostname=host, insecure=insecure, tls_verify=verify, auth_backend=backend
            )
            client.auth.set_basic_auth(credentials.username, credentials.password)
            response = client.do_request(url, "HEAD", headers=dict(headers))
    except (requests.RequestException, ValueError, OSError) as e:
        return Answer(Existence.UNKNOWN, f"cannot reach registry {host}: {type(e).__name__}")
    if response.status_code == 200:
        return Answer(Existence.EXISTS)
    if response.status_code == 404:
        return Answer(Existence.MISSING)
    if response.status_code in (401, 403):
        why = (
            "no credentials for it in imageRepoSecret"
            if credentials is None
            else "the credentials in imageRepoSecret were refused"
        )
        return Answer(Existence.UNKNOWN, f"registry {host} requires authentication and {why}")
    return Answer(Existence.UNKNOWN, f"registry {host} answered HTTP {response.status_code}")


def _repository(ref: ImageReference) -> str:
    if registry_host(ref) == DOCKER_HUB and "/" not in ref.path:
        return f"library/{ref.path}"
    return ref.path


class AnswerCache:
    """Recent answers, so one reconcile pass over many nodes asks once per image.

    Only EXISTS answers are kept for long: a missing image is re-checked soon,
    because a build or a push may land at any moment.
    """

    def __init__(self, exists_ttl: float = 600.0, other_ttl: float = 20.0) -> None:
        self._ttl = {Existence.EXISTS: exists_ttl}
        self._other_ttl = other_ttl
        self._entries: dict[tuple[str, str], tuple[float, Answer]] = {}

    def get(self, key: tuple[str, str], now: float | None = None) -> Answer | None:
        now = time.monotonic() if now is None else now
        hit = self._entries.get(key)
        if hit is None:
            return None
        at, answer = hit
        if now - at > self._ttl.get(answer.existence, self._other_ttl):
            del self._entries[key]
            return None
        return answer

    def put(self, key: tuple[str, str], answer: Answer, now: float | None = None) -> None:
        self._entries[key] = (time.monotonic() if now is None else now, answer)

    def forget(self, image: str) -> None:
        for key in [k for k in self._entries if k[0] == image]:
            del self._entries[key]
