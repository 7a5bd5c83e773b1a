"""Build small images and push or read them, independently of the product's client.

The signer's tests push their unsigned images with this and read the signed
ones back with it, so a bug in ``kmodkit.core.signer.oci`` cannot hide itself.
urllib, basic auth or a token from the registry's realm, TLS verified against
the test CA.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import ssl
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from kmodkit_dev.registry import Registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


@dataclass(frozen=True)
class Member:
    """One tar member: a file (content), a directory (content None) or a symlink."""

    path: str  # without a leading "/", as image layers write them
    content: bytes | None = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    symlink: str = ""


def layer(members: list[Member]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.path)
            info.mode, info.uid, info.gid, info.mtime = m.mode, m.uid, m.gid, 1_700_000_000
            if m.symlink:
                info.type, info.linkname = tarfile.SYMTYPE, m.symlink
                tar.addfile(info)
            elif m.content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(m.content)
                tar.addfile(info, io.BytesIO(m.content))
    return gzip.compress(raw.getvalue(), mtime=0)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_files(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    """A layer's members by path: header and content (None for all but files)."""
    found: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar.getmembers():
            stream = tar.extractfile(member) if member.isreg() else None
            found[member.name.rstrip("/")] = (member, stream.read() if stream else None)
    return found


@dataclass
class Client:
    registry: Registry
    password: str = ""  # another than the registry's, to play a wrong one
    _tokens: dict[str, str] = field(default_factory=dict)

    def push_image(
        self,
        repository: str,
        tag: str,
        layers: list[bytes],
        architecture: str = "amd64",
        history: bool = True,
        docker: bool = False,
        entrypoint: list[str] | None = None,
    ) -> tuple[str, int]:
        """Push an image of ``layers`` (OCI, or Docker schema 2); (manifest digest, size)."""
        kind, config_kind, layer_kind = (
            (DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER)
            if docker
            else (OCI_MANIFEST, OCI_CONFIG, OCI_LAYER)
        )
        diff_ids = [digest(gzip.decompress(data)) for data in layers]
        config: dict[str, Any] = {
            "architecture": architecture,
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/bin"],
                **({"Entrypoint": entrypoint} if entrypoint else {}),
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        if history:
            config["history"] = [{"created_by": f"layer {n}"} for n in range(len(layers))]
        config_body = json.dumps(config).encode()
        for data in [*layers, config_body]:
            self.push_blob(repository, data)
        manifest = {
            "schemaVersion": 2,
            "mediaType": kind,
            "config": {
                "mediaType": config_kind,
                "digest": digest(config_body),
                "size": len(config_body),
            },
            "layers": [
                {"mediaType": layer_kind, "digest": digest(data), "size": len(data)}
                for data in layers
            ],
        }
        body = json.dumps(manifest).encode()
        self._request("PUT", repository, f"manifests/{tag}", body, {"Content-Type": kind})
        return digest(body), len(body)

    def push_index(self, repository: str, tag: str, manifests: list[tuple[str, int, str]]) -> None:
        """An index of (digest, size, architecture) linux manifests already pushed."""
        index = {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": d,
                    "size": size,
                    "platform": {"os": "linux", "architecture": arch},
                }
                for d, size, arch in manifests
            ],
        }
        body = json.dumps(index).encode()
        self._request("PUT", repository, f"manifests/{tag}", body, {"Content-Type": OCI_INDEX})

    def push_blob(self, repository: str, data: bytes) -> None:
        start = self._request("POST", repository, "blobs/uploads/", b"", {})
        location = urllib.parse.urljoin(self.registry.url, start.headers["Location"])
        sep = "&" if "?" in location else "?"
        self._send("PUT", f"{location}{sep}digest={digest(data)}", repository, data,
                   {"Content-Type": "application/octet-stream"})  # fmt: skip

    def manifest(self, repository: str, reference: str) -> tuple[dict[str, Any], str]:
        accept = f"{OCI_MANIFEST}, {OCI_INDEX}, {DOCKER_MANIFEST}"
        reply = self._request("GET", repository, f"manifests/{reference}", None, {"Accept": accept})
        body = reply.read()
        return json.loads(body), digest(body)

    def blob(self, repository: str, blob_digest: str) -> bytes:
        data: bytes = self._request("GET", repository, f"blobs/{blob_digest}", None, {}).read()
        assert digest(data) == blob_digest
        return data

    def _request(
        self, method: str, repository: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Any:
        url = f"{self.registry.url}/v2/{repository}/{path}"
        return self._send(method, url, repository, body, headers)

    def _send(
        self, method: str, url: str, repository: str, body: bytes | None, headers: dict[str, str]
    ) -> Any:
        request = urllib.request.Request(
            url, body, {**headers, **self._auth(repository)}, method=method
        )
        return urllib.request.urlopen(request, context=self._context(), timeout=30)

    def _context(self) -> ssl.SSLContext | None:
        # None for a plain-HTTP registry, which has no CA.
        return (
            ssl.create_default_context(cafile=str(self.registry.ca)) if self.registry.ca else None
        )

    def _auth(self, repository: str) -> dict[str, str]:
        user, password = self.registry.username, self.password or self.registry.password
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        issuer = self.registry.issuer
        if issuer is None:
            return {"Authorization": f"Basic {basic}"}
        if repository not in self._tokens:
            query = urllib.parse.urlencode(
                {"service": "kmodkit-test-registry", "scope": f"repository:{repository}:pull,push"}
            )
            request = urllib.request.Request(
                f"{issuer.url}?{query}", headers={"Authorization": f"Basic {basic}"}
            )
            with urllib.request.urlopen(request, context=self._context(), timeout=30) as reply:
                self._tokens[repository] = json.loads(reply.read())["token"]
        return {"Authorization": f"Bearer {self._tokens[repository]}"}
