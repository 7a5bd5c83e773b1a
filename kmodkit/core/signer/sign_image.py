"""One signing: pull the unsigned image, sign the listed modules, push the signed image.

The thin I/O around the pure parts (layers, manifests, certificate): registry
exchanges through ``oci``, files in a scratch directory that is removed at the
end, and ``sign-file`` for each module. Every step reports one log line.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kmodkit.core.api import RegistryTLS
from kmodkit.core.engine.images import ImageReference, ImageReferenceError, parse_image_reference
from kmodkit.core.engine.registry import Credentials, PullSecret, parse_docker_config, ssl_context
from kmodkit.core.signer import layers, manifests, sign_file
from kmodkit.core.signer.certificate import Certificate, CertificateError, read_certificate
from kmodkit.core.signer.errors import SignerError, UsageError
from kmodkit.core.signer.oci import Registry

Log = Callable[..., None]  # log(event, **fields): one JSON line


@dataclass(frozen=True)
class Request:
    unsigned_image: str
    image: str
    files: tuple[str, ...]
    key: Path
    cert: Path
    docker_config: Path | None = None
    push_tls: RegistryTLS = field(default_factory=RegistryTLS)
    pull_tls: RegistryTLS = field(default_factory=RegistryTLS)
    platform: str = "linux/amd64"
    hash_algorithm: str = "sha256"
    sign_file: str | None = None
    ca_bundle: str | None = None  # KMODKIT_REGISTRY_CA


@dataclass(frozen=True)
class _Checked:
    unsigned: ImageReference
    target: ImageReference
    files: tuple[str, ...]
    platform: manifests.Platform
    certificate: Certificate
    sign_file: Path
    logins: PullSecret


def check(request: Request) -> _Checked:
    """Everything that can be checked before the first network request."""
    unsigned = _reference("--unsigned-image", request.unsigned_image)
    if unsigned.tag is None and unsigned.digest is None:
        raise UsageError(
            f"--unsigned-image {request.unsigned_image} names no tag or digest; add one"
        )
    target = _reference("--image", request.image)
    if target.tag is None or target.digest is not None:
        raise UsageError(
            f"--image {request.image} must name a tag and no digest: the signed image's "
            "digest is known only once it is made"
        )
    files = layers.check_entries(request.files)
    platform = manifests.parse_platform(request.platform)
    sign_file.check_hash_algorithm(request.hash_algorithm)
    # The key is handed to sign-file unopened: only whether it can be read is checked.
    if not request.key.is_file() or not os.access(request.key, os.R_OK):
        raise UsageError(f"--key {request.key} is not a readable file; mount the key Secret there")
    try:
        certificate = read_certificate(request.cert.read_bytes())
    except OSError as e:
        raise UsageError(f"--cert {request.cert} cannot be read: {e.strerror}") from None
    except CertificateError as e:
        raise UsageError(f"--cert {request.cert}: {e}; give the signing certificate") from None
    return _Checked(
        unsigned,
        target,
        files,
        platform,
        certificate,
        sign_file.find_sign_file(request.sign_file),
        _logins(request.docker_config),
    )


def _reference(flag: str, text: str) -> ImageReference:
    try:
        return parse_image_reference(text)
    except ImageReferenceError as e:
        raise UsageError(f"{flag} {text!r} {e}") from None


def _logins(path: Path | None) -> PullSecret:
    if path is None:
        return PullSecret("--docker-config")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise UsageError(f"--docker-config {path} cannot be read: {why}") from None
    try:
        return PullSecret(str(path), parse_docker_config(text))
    except ValueError as e:
        raise UsageError(
            f"--docker-config {path} {e}; mount the .dockerconfigjson of a "
            "kubernetes.io/dockerconfigjson Secret there"
        ) from None


def sign_image(request: Request, log: Log) -> str:
    """Sign, push, and return the signed image's digest."""
    checked = check(request)
    scratch = Path(tempfile.mkdtemp(prefix="kmodkit-sign-"))
    try:
        return _sign(request, checked, log, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _registry(
    ref: ImageReference,
    tls: RegistryTLS,
    request: Request,
    logins: PullSecret,
    scopes: tuple[str, ...],
) -> Registry:
    try:
        context = ssl_context(tls, request.ca_bundle)
    except (OSError, ValueError) as e:
        raise SignerError(
            f"cannot load the registry CA bundle {request.ca_bundle}: "
            f"{getattr(e, 'strerror', None) or type(e).__name__}"
        ) from None
    login: Credentials | None = logins.credentials_for(ref.registry)
    return Registry(ref.registry, login, context, tls.insecure, scopes, str(logins.name))


def _sign(request: Request, checked: _Checked, log: Log, scratch: Path) -> str:
    unsigned, target = checked.unsigned, checked.target
    same_registry = unsigned.registry == target.registry
    pull = _registry(
        unsigned,
        request.pull_tls,
        request,
        checked.logins,
        (f"repository:{unsigned.repository}:pull",),
    )
    image = _pull_manifest(pull, unsigned, checked.platform, request.unsigned_image, log)
    config = manifests.load(
        pull.get_blob(unsigned.repository, image.config.digest), "the unsigned image's config"
    )

    layer_files = [scratch / f"layer-{n}" for n in range(len(image.layers))]
    fs = layers.FileSystem()
    for n, (descriptor, path) in enumerate(zip(image.layers, layer_files, strict=True)):
        pull.download_blob(unsigned.repository, descriptor.digest, descriptor.size, path)
        fs.apply(_headers(path, n))
    chosen = layers.select(fs, checked.files)
    log(
        "pulled",
        image=request.unsigned_image,
        layers=len(image.layers),
        size=sum(d.size for d in image.layers),
        modules=[e.header.path for e in chosen],
    )

    signed = _sign_modules(request, checked, chosen, layer_files, scratch, log)
    blob = layers.signed_layer(fs, signed)

    push_scopes = [f"repository:{target.repository}:pull,push"]
    if same_registry and unsigned.repository != target.repository:
        push_scopes.append(f"repository:{unsigned.repository}:pull")  # to mount its blobs
    push = _registry(target, request.push_tls, request, checked.logins, tuple(push_scopes))
    mount_from = unsigned.repository if same_registry else None
    for descriptor, path in zip(image.layers, layer_files, strict=True):
        how = push.push_blob(
            target.repository, descriptor.digest, descriptor.size, path, mount_from
        )
        log("layer", digest=descriptor.digest, size=descriptor.size, reuse=how.value)
    layer_descriptor = manifests.Descriptor(
        manifests.signed_layer_type(image.media_type), blob.digest, blob.size, {}
    )
    how = push.push_blob(target.repository, blob.digest, blob.size, blob.data)
    log("layer", digest=blob.digest, size=blob.size, reuse=how.value, signed=True)

    config_body = manifests.signed_config(config, len(image.layers), blob.diff_id, len(signed))
    config_descriptor = manifests.Descriptor(
        image.config.media_type, layers.digest_of(config_body), len(config_body), image.config.raw
    )
    push.push_blob(target.repository, config_descriptor.digest, len(config_body), config_body)
    body = manifests.signed_manifest(image, config_descriptor, layer_descriptor)
    digest = push.put_manifest(target.repository, str(target.tag), image.media_type, body)
    log("pushed", image=request.image, digest=digest, modules=len(signed))
    return digest


def _pull_manifest(
    pull: Registry,
    ref: ImageReference,
    platform: manifests.Platform,
    image: str,
    log: Log,
) -> manifests.Image:
    content_type, body, digest = pull.get_manifest(ref.repository, ref.digest or str(ref.tag))
    document = manifests.load(body, f"the manifest of {image}")
    media_type = manifests.media_type_of(content_type, document)
    if media_type in manifests.INDEXES:
        chosen = manifests.pick_platform(document, platform, image)
        log("index", image=image, digest=digest, platform=str(platform), manifest=chosen.digest)
        content_type, body, digest = pull.get_manifest(ref.repository, chosen.digest)
        document = manifests.load(body, f"the {platform} manifest of {image}")
        media_type = manifests.media_type_of(content_type, document)
    return manifests.read_manifest(document, media_type, image)


def _headers(path: Path, n: int) -> list[layers.Header]:
    try:
        with tarfile.open(path, mode="r|*") as tar:
            return [layers.header_from_tarinfo(member) for member in tar]
    except (tarfile.TarError, OSError, EOFError) as e:
        raise SignerError(f"layer {n} of the unsigned image is not a readable tar: {e}") from None


def _sign_modules(
    request: Request,
    checked: _Checked,
    chosen: list[layers.Entry],
    layer_files: list[Path],
    scratch: Path,
    log: Log,
) -> dict[str, bytes]:
    """Sign each chosen module, in path order: image path → signed content."""
    contents: dict[str, bytes] = {}
    for n, path in enumerate(layer_files):
        wanted = layers.wanted_in_layer(chosen, n)
        if wanted:
            contents.update(_contents(path, n, wanted))
    signed: dict[str, bytes] = {}
    for number, image_path in enumerate(sorted(contents)):
        sign_file.check_module(image_path, contents[image_path])
        module = scratch / f"module-{number}.ko"
        module.write_bytes(contents[image_path])
        signed[image_path] = sign_file.sign(
            checked.sign_file,
            request.hash_algorithm,
            request.key,
            request.cert,
            module,
            scratch / f"module-{number}.signed.ko",
        )
        log(
            "signed",
            path=image_path,
            signer=checked.certificate.issuer_common_name,
            subject=checked.certificate.subject,
            serial=checked.certificate.serial,
            hash=request.hash_algorithm,
        )
    return signed


def _contents(path: Path, n: int, wanted: dict[str, tuple[str, ...]]) -> dict[str, bytes]:
    """The content of the wanted members of one layer (member path → chosen paths)."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                name = layers.normalise(member.name)
                if name in wanted and member.isreg():
                    stream = tar.extractfile(member)
                    assert stream is not None  # a regular member always has content
                    content = stream.read()
                    found.update(dict.fromkeys(wanted[name], content))
    except (tarfile.TarError, OSError, EOFError) as e:
        raise SignerError(f"layer {n} of the unsigned image is not a readable tar: {e}") from None
    missing = sorted({p for paths in wanted.values() for p in paths} - set(found))
    if missing:
        raise SignerError(f"layer {n} of the unsigned image lacks the content of {missing[0]}")
    return found


def log_fields(request: Request) -> dict[str, Any]:
    """What the start line says of a request."""
    return {
        "unsigned_image": request.unsigned_image,
        "image": request.image,
        "files": list(request.files),
        "platform": request.platform,
        "registry_ca": request.ca_bundle or "the system's only",
    }
