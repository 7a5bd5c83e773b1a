"""Image references follow the OCI distribution grammar."""

from __future__ import annotations

import pytest

from kmodkit.core.engine.images import (
    ImageReference,
    ImageReferenceError,
    parse_image_reference,
    require_tag_or_digest,
)

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("reference", "parsed"),
    [
        ("busybox", ImageReference("", "busybox", None, None)),
        ("busybox:1.36", ImageReference("", "busybox", "1.36", None)),
        ("org/mod:v1", ImageReference("", "org/mod", "v1", None)),
        ("quay.io/org/mod:6.8.0-45", ImageReference("quay.io", "org/mod", "6.8.0-45", None)),
        ("registry:5000/mod", ImageReference("registry:5000", "mod", None, None)),
        ("localhost/mod:x", ImageReference("localhost", "mod", "x", None)),
        ("[::1]:5000/mod:x", ImageReference("[::1]:5000", "mod", "x", None)),
        (f"quay.io/mod@{DIGEST}", ImageReference("quay.io", "mod", None, DIGEST)),
        (f"quay.io/mod:v1@{DIGEST}", ImageReference("quay.io", "mod", "v1", DIGEST)),
        ("r.io/a__b/c-d.e:x_Y", ImageReference("r.io", "a__b/c-d.e", "x_Y", None)),
    ],
)
def test_parse(reference: str, parsed: ImageReference) -> None:
    assert parse_image_reference(reference) == parsed


@pytest.mark.parametrize(
    ("reference", "complaint"),
    [
        ("", "is empty"),
        ("quay.io/Org/mod:v1", "invalid repository path"),
        ("quay.io/mod:.v1", "invalid tag"),
        ("quay.io/mod:" + "v" * 129, "invalid tag"),
        ("quay.io/mod@sha256:abc", "invalid digest"),
        ("-bad.io/mod:v1", "invalid registry host"),
        ("quay.io/mod:${KERNEL_FULL_VERSION}", "invalid tag"),
        ("quay.io/" + "a" * 250 + ":v1", "longer than 255"),
    ],
)
def test_parse_errors(reference: str, complaint: str) -> None:
    with pytest.raises(ImageReferenceError, match=complaint):
        parse_image_reference(reference)


def test_a_port_is_not_a_tag() -> None:
    with pytest.raises(ImageReferenceError, match="no tag or digest"):
        require_tag_or_digest("registry:5000/mod")
    assert require_tag_or_digest("registry:5000/mod:v1").tag == "v1"
    assert require_tag_or_digest(f"registry:5000/mod@{DIGEST}").digest == DIGEST


@pytest.mark.parametrize(
    ("reference", "registry", "repository"),
    [
        ("ubuntu:24.04", "registry-1.docker.io", "library/ubuntu"),
        ("docker.io/ubuntu:24.04", "registry-1.docker.io", "library/ubuntu"),
        ("docker.io/library/ubuntu:24.04", "registry-1.docker.io", "library/ubuntu"),
        ("index.docker.io/nvidia/cuda:12", "registry-1.docker.io", "nvidia/cuda"),
        ("Docker.IO/busybox:1", "registry-1.docker.io", "library/busybox"),
        ("registry-1.docker.io/org/mod:1", "registry-1.docker.io", "org/mod"),
        ("org/mod:1", "registry-1.docker.io", "org/mod"),
        ("quay.io/mod:1", "quay.io", "mod"),
        ("localhost:5000/mod:1", "localhost:5000", "mod"),
        ("registry.k8s.io/pause:3.10", "registry.k8s.io", "pause"),
    ],
)
def test_the_registry_to_ask_and_the_repository_there(
    reference: str, registry: str, repository: str
) -> None:
    parsed = parse_image_reference(reference)
    assert (parsed.registry, parsed.repository) == (registry, repository)
