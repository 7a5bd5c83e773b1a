"""Reading the unsigned image's manifest and index, writing the signed one's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kmodkit.core.signer.errors import SignerError, UsageError
from kmodkit.core.signer.manifests import (
    DOCKER_LAYER_GZIP,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_LAYER_GZIP,
    OCI_MANIFEST,
    Descriptor,
    Platform,
    media_type_of,
    parse_platform,
    pick_platform,
    read_manifest,
    signed_config,
    signed_layer_type,
    signed_manifest,
)

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
C = "sha256:" + "c" * 64


def _entry(digest: str, arch: str, variant: str = "", os: str = "linux") -> dict[str, Any]:
    platform = {"os": os, "architecture": arch, **({"variant": variant} if variant else {})}
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": 10, "platform": platform}


def test_the_index_entry_for_the_platform_is_picked_and_a_bare_one_beats_a_variant() -> None:
    index = {
        "manifests": [
            _entry(A, "amd64"),
            _entry(B, "arm64", "v8"),
            _entry(C, "arm64"),
            # An attestation rides along with an unknown platform.
            _entry("sha256:" + "d" * 64, "unknown", os="unknown"),
        ]
    }
    assert pick_platform(index, Platform("linux", "amd64"), "img").digest == A
    assert pick_platform(index, Platform("linux", "arm64"), "img").digest == C
    assert pick_platform(index, Platform("linux", "arm64", "v8"), "img").digest == B
    with pytest.raises(SignerError) as failed:
        pick_platform(index, Platform("linux", "s390x"), "img")
    assert str(failed.value) == (
        "--unsigned-image img is an index with no manifest for linux/s390x "
        "(it has: linux/amd64, linux/arm64, linux/arm64/v8); give one of those as --platform"
    )


def test_a_platform_is_os_and_architecture_with_an_optional_variant() -> None:
    assert parse_platform("linux/arm/v7") == Platform("linux", "arm", "v7")
    assert str(parse_platform("linux/amd64")) == "linux/amd64"
    for bad in ("amd64", "linux/", "linux/arm/v7/x"):
        with pytest.raises(UsageError, match="--platform"):
            parse_platform(bad)


def test_the_kind_of_a_manifest_is_its_own_then_the_content_type_then_its_shape() -> None:
    assert media_type_of("application/json", {"mediaType": DOCKER_MANIFEST}) == DOCKER_MANIFEST
    assert media_type_of(f"{OCI_INDEX}; charset=utf-8", {}) == OCI_INDEX
    assert media_type_of("", {"manifests": []}) == OCI_INDEX
    assert media_type_of("", {"layers": []}) == OCI_MANIFEST


def _manifest(*layer_types: str) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": A, "size": 2},
        "layers": [{"mediaType": t, "digest": B, "size": 3} for t in layer_types],
        "annotations": {"org.example": "kept"},
        "subject": {"mediaType": OCI_MANIFEST, "digest": C, "size": 4},
    }


def test_layers_kmodkit_cannot_read_are_refused_by_name() -> None:
    with pytest.raises(SignerError, match=r"layer 1 of img is .*tar\+zstd, which kmodkit-sign"):
        read_manifest(
            _manifest(OCI_LAYER_GZIP, "application/vnd.oci.image.layer.v1.tar+zstd"),
            OCI_MANIFEST,
            "img",
        )
    foreign = _manifest(DOCKER_LAYER_GZIP)
    foreign["layers"][0]["urls"] = ["https://example.com/layer"]
    with pytest.raises(SignerError, match="foreign layer"):
        read_manifest(foreign, OCI_MANIFEST, "img")
    with pytest.raises(SignerError, match="not an image manifest"):
        read_manifest({}, "application/vnd.docker.distribution.manifest.v1+json", "img")


def test_the_signed_manifest_is_the_unsigned_one_plus_a_layer_without_its_subject() -> None:
    image = read_manifest(_manifest(OCI_LAYER_GZIP), OCI_MANIFEST, "img")
    config = Descriptor("application/vnd.oci.image.config.v1+json", C, 9, {})
    layer = Descriptor(signed_layer_type(OCI_MANIFEST), A, 5, {})
    signed = json.loads(signed_manifest(image, config, layer))
    assert signed["layers"] == [
        {"mediaType": OCI_LAYER_GZIP, "digest": B, "size": 3},
        {"mediaType": OCI_LAYER_GZIP, "digest": A, "size": 5},
    ]
    assert signed["config"]["digest"] == C and signed["config"]["size"] == 9
    assert signed["annotations"] == {"org.example": "kept"}
    assert "subject" not in signed
    assert signed_layer_type(DOCKER_MANIFEST) == DOCKER_LAYER_GZIP


def test_the_signed_config_adds_the_diff_id_and_a_history_entry_without_a_time() -> None:
    config = {
        "architecture": "amd64",
        "created": "2024-01-01T00:00:00Z",
        "rootfs": {"type": "layers", "diff_ids": [A, B]},
        "history": [{"created_by": "one"}, {"created_by": "two"}],
    }
    signed = json.loads(signed_config(config, 2, C, 3))
    assert signed["rootfs"] == {"type": "layers", "diff_ids": [A, B, C]}
    assert signed["history"][-1] == {
        "created_by": "kmodkit-sign: 3 signed modules",
        "comment": "kmodkit-sign",
    }
    assert signed["created"] == "2024-01-01T00:00:00Z"
    assert signed_config(config, 2, C, 3) == signed_config(config, 2, C, 3)
    without_history = json.loads(signed_config({"rootfs": {"diff_ids": [A]}}, 1, C, 1))
    assert "history" not in without_history
    with pytest.raises(SignerError, match="lists 2 layer diff_ids for 3 layers"):
        signed_config(config, 3, C, 1)
