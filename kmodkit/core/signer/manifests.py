"""Image manifests, indexes and configs: read the unsigned image's, write the signed one's.

Pure. Both families are read, OCI's and Docker's schema 2; the signed image keeps
the family of the unsigned one, so the runtimes that pulled it pull the signed one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kmodkit.core.signer.errors import SignerError, UsageError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)

OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
# Layers tarfile reads (plain or gzip'd tar); anything else is refused by name.
READABLE_LAYERS = (
    "application/vnd.oci.image.layer.v1.tar",
    OCI_LAYER_GZIP,
    DOCKER_LAYER_GZIP,
)
_SIGNED_LAYER = {OCI_MANIFEST: OCI_LAYER_GZIP, DOCKER_MANIFEST: DOCKER_LAYER_GZIP}


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


def parse_platform(text: str) -> Platform:
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(
            f"--platform {text!r} is not os/architecture[/variant], such as linux/amd64"
        )
    return Platform(*parts)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    raw: Mapping[str, Any]  # as the manifest has it, annotations and all

    @classmethod
    def of(cls, raw: object, what: str) -> Descriptor:
        if not isinstance(raw, dict):
            raise SignerError(f"{what} is not a JSON object")
        digest, size = raw.get("digest"), raw.get("size")
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            raise SignerError(f"{what} has no sha256 digest")
        if not isinstance(size, int) or size < 0:
            raise SignerError(f"{what} has no size")
        return cls(str(raw.get("mediaType", "")), digest, size, raw)

    def json(self) -> dict[str, Any]:
        return {**self.raw, "mediaType": self.media_type, "digest": self.digest, "size": self.size}


def media_type_of(content_type: str, body: Mapping[str, Any]) -> str:
    """The manifest's kind: its own ``mediaType``, else the Content-Type it came with,
    else its shape (OCI lets a manifest leave ``mediaType`` out)."""
    declared = body.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    content_type = content_type.split(";", 1)[0].strip()
    if content_type in INDEXES + MANIFESTS:
        return content_type
    if "manifests" in body:
        return OCI_INDEX
    return OCI_MANIFEST


def load(body: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        raise SignerError(f"{what} is not JSON") from None
    if not isinstance(document, dict):
        raise SignerError(f"{what} is not a JSON object")
    return document


def pick_platform(index: Mapping[str, Any], platform: Platform, image: str) -> Descriptor:
    """The index's manifest for ``platform``; without a variant, one without a variant
    is preferred (linux/arm64 over linux/arm64/v8 as written in indexes)."""
    offered: list[tuple[Platform, Descriptor]] = []
    for n, raw in enumerate(index.get("manifests") or []):
        descriptor = Descriptor.of(raw, f"manifest {n} of the index of {image}")
        p = raw.get("platform") or {}
        if not isinstance(p, dict) or descriptor.media_type not in MANIFESTS:
            continue  # attestations and other artifacts ride along in indexes
        offered.append(
            (
                Platform(
                    str(p.get("os", "")), str(p.get("architecture", "")), str(p.get("variant", ""))
                ),
                descriptor,
            )
        )
    matching = [
        (p, d)
        for p, d in offered
        if p.os == platform.os
        and p.architecture == platform.architecture
        and (not platform.variant or p.variant == platform.variant)
    ]
    if not matching:
        held = ", ".join(sorted({str(p) for p, _ in offered if p.os != "unknown"})) or "none"
        raise SignerError(
            f"--unsigned-image {image} is an index with no manifest for {platform} "
            f"(it has: {held}); give one of those as --platform"
        )
    return min(matching, key=lambda pd: pd[0].variant != "")[1]


@dataclass(frozen=True)
class Image:
    """One platform's manifest of the unsigned image."""

    media_type: str
    manifest: Mapping[str, Any]
    config: Descriptor
    layers: tuple[Descriptor, ...]


def read_manifest(document: Mapping[str, Any], media_type: str, image: str) -> Image:
    if media_type not in MANIFESTS:
        raise SignerError(
            f"--unsigned-image {image} is a {media_type or 'manifest of unknown type'}, not an "
            "image manifest; kmodkit-sign reads OCI and Docker schema 2 images"
        )
    config = Descriptor.of(document.get("config"), f"the config of {image}")
    raw_layers = document.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers:
        raise SignerError(f"--unsigned-image {image} has no layers")
    layers = tuple(Descriptor.of(raw, f"layer {n} of {image}") for n, raw in enumerate(raw_layers))
    for n, layer in enumerate(layers):
        if layer.media_type not in READABLE_LAYERS:
            raise SignerError(
                f"layer {n} of {image} is {layer.media_type}, which kmodkit-sign cannot read; "
                "push the unsigned image with tar or gzip'd tar layers"
            )
        if layer.raw.get("urls"):
            raise SignerError(
                f"layer {n} of {image} is a foreign layer (fetched from other URLs); "
                "kmodkit-sign signs images whose layers are all in the registry"
            )
    return Image(media_type, document, config, layers)


def signed_config(config: Mapping[str, Any], layers: int, diff_id: str, files: int) -> bytes:
    """The unsigned image's config with the signed layer added: its diff_id, and a history
    entry when the config keeps a history. No timestamp: the same modules and key make
    the same image digest, so a repeated signing pushes nothing new."""
    rootfs = config.get("rootfs")
    rootfs = rootfs if isinstance(rootfs, dict) else {}
    diff_ids = rootfs.get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != layers:
        raise SignerError(
            f"the unsigned image's config lists {len(diff_ids or [])} layer diff_ids for "
            f"{layers} layers; push it again with a tool that writes a valid config"
        )
    signed = dict(config)
    signed["rootfs"] = {**rootfs, "diff_ids": [*diff_ids, diff_id]}
    history = config.get("history")
    if isinstance(history, list):
        plural = "s" if files != 1 else ""
        signed["history"] = [
            *history,
            {
                "created_by": f"kmodkit-sign: {files} signed module{plural}",
                "comment": "kmodkit-sign",
            },
        ]
    return _canonical(signed)


def signed_manifest(image: Image, config: Descriptor, layer: Descriptor) -> bytes:
    """The unsigned manifest with the new config and one more layer; a ``subject`` is
    dropped, since the signed image refers to nothing."""
    manifest = {k: v for k, v in image.manifest.items() if k != "subject"}
    manifest["mediaType"] = image.media_type
    manifest["config"] = config.json()
    manifest["layers"] = [*(d.json() for d in image.layers), layer.json()]
    return _canonical(manifest)


def signed_layer_type(manifest_type: str) -> str:
    return _SIGNED_LAYER[manifest_type]


def _canonical(document: Mapping[str, Any] | Sequence[Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
