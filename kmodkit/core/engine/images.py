"""Image references: the OCI distribution grammar, strictly.

KMM only checks that an image contains ':' or '@', so ``registry:5000/driver``
(a port, no tag) passes and later pulls ``:latest``. kmodkit parses the full
reference grammar and insists on an explicit tag or digest for module images.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_DOMAIN_RE = re.compile(rf"^{_DOMAIN}$")
_PATH_RE = re.compile(rf"^{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
_TAG_RE = re.compile(rf"^{_TAG}$")
_DIGEST_RE = re.compile(rf"^{_DIGEST}$")

MAX_NAME_LENGTH = 255

DOCKER_HUB = "registry-1.docker.io"
"""Where Docker Hub serves the distribution API; ``docker.io`` itself answers none of it."""
DOCKER_HUB_NAMES = frozenset({"docker.io", "index.docker.io", DOCKER_HUB})


class ImageReferenceError(ValueError):
    """A string that is not an image reference; the message says what is wrong."""


@dataclass(frozen=True)
class ImageReference:
    """A parsed image reference such as ``quay.io/org/driver:6.8.0@sha256:...``."""

    domain: str
    """Registry host (and port); empty when the reference names none."""
    path: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def registry(self) -> str:
        """The host to ask: Docker Hub's API host for no host or any of Docker Hub's names."""
        if not self.domain or self.domain.lower() in DOCKER_HUB_NAMES:
            return DOCKER_HUB
        return self.domain

    @property
    def repository(self) -> str:
        """The repository on that host: Docker Hub keeps one-word names under ``library/``."""
        if self.registry == DOCKER_HUB and "/" not in self.path:
            return f"library/{self.path}"
        return self.path


def parse_image_reference(reference: str) -> ImageReference:
    """Parse ``reference``, or raise ImageReferenceError saying what is wrong."""
    if not reference:
        raise ImageReferenceError("is empty")
    name, digest = reference, None
    if "@" in name:
        name, digest = name.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise ImageReferenceError(
                f"has an invalid digest {digest!r}; a digest looks like sha256:<64 hex digits>"
            )
    tag = None
    last_slash = name.rfind("/")
    if (colon := name.rfind(":")) > last_slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG_RE.match(tag):
            raise ImageReferenceError(
                f"has an invalid tag {tag!r}; a tag is at most 128 letters, digits, '_', '.' "
                "or '-' and does not start with '.' or '-'"
            )
    if len(name) > MAX_NAME_LENGTH:
        raise ImageReferenceError(f"has a name longer than {MAX_NAME_LENGTH} characters")
    domain, path = _split_domain(name)
    if domain and not _DOMAIN_RE.match(domain):
        raise ImageReferenceError(f"has an invalid registry host {domain!r}")
    if not _PATH_RE.match(path):
        raise ImageReferenceError(
            f"has an invalid repository path {path!r}; path components are lowercase letters "
            "and digits, separated by '.', '_', '__' or '-', joined with '/'"
        )
    return ImageReference(domain=domain, path=path, tag=tag, digest=digest)


def _split_domain(name: str) -> tuple[str, str]:
    # As in the docker reference grammar: the first component is a registry
    # host only if it looks like one (a dot, a port, or 'localhost').
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return first, rest
    return "", name


def require_tag_or_digest(reference: str) -> ImageReference:
    """Parse ``reference`` and insist it pins a tag or a digest."""
    parsed = parse_image_reference(reference)
    if parsed.tag is None and parsed.digest is None:
        raise ImageReferenceError(
            f"has no tag or digest, so it would pull {parsed.name}:latest; add one, e.g. "
            f"{parsed.name}:${{KERNEL_FULL_VERSION}}"
        )
    return parsed
