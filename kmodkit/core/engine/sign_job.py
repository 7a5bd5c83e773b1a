"""The signing Job's container: ``kmodkit-sign`` makes the signed image from the unsigned one.

KMM signs with a kaniko build of a generated Dockerfile whose middle stage holds the key.
Here the signer pulls the unsigned image, signs copies of the listed files with the
kernel's ``sign-file`` and pushes the unsigned layers plus one layer of signed files:
no builder, no root, no privilege, and the private key is read by ``sign-file`` alone.
The operator never reads the key or the certificate; its Jobs name the Secrets only.
"""

from __future__ import annotations

from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.kernel_mapping import ResolvedMapping
from kmodkit.core.engine.registry import tls_flags

KEY_KEY, CERT_KEY = "key", "cert"
"""The keys of the two Secrets, as KMM names them."""
KEY_PATH = "/run/secrets/key/key.pem"
CERT_PATH = "/run/secrets/cert/cert.pem"
AUTH_PATH = "/docker/config.json"
SIGNER_USER = 65532
"""The signer image's unprivileged user."""


def signer_args(module: Module, image: str, resolved: ResolvedMapping, arch: str) -> list[str]:
    """The signer's command line: from the unsigned image to ``image``, every listed file."""
    sign = resolved.sign
    assert sign is not None
    args = ["--unsigned-image", sign.unsigned_image, "--image", image]
    for entry in sign.files_to_sign:
        args += ["--file", entry]
    args += ["--key", KEY_PATH, "--cert", CERT_PATH, "--platform", f"linux/{arch}"]
    if module.spec.image_repo_secret is not None:
        args += ["--docker-config", AUTH_PATH]
    return [
        *args,
        *tls_flags(resolved.registry_tls, push=True),
        *tls_flags(sign.unsigned_image_registry_tls, push=False),
    ]


def signer_volumes(module: Module, resolved: ResolvedMapping) -> list[dict[str, Any]]:
    """The key and certificate Secrets, and the pull secret when the Module has one."""
    sign = resolved.sign
    assert sign is not None
    volumes: list[dict[str, Any]] = [
        _secret_volume("signing-key", sign.key_secret, KEY_KEY, "key.pem"),
        _secret_volume("signing-cert", sign.cert_secret, CERT_KEY, "cert.pem"),
        {"name": "scratch", "emptyDir": {}},
    ]
    if module.spec.image_repo_secret is not None:
        volumes.append(
            _secret_volume(
                "registry-auth",
                module.spec.image_repo_secret.name,
                ".dockerconfigjson",
                "config.json",
            )
        )
    return volumes


def signer_container(
    module: Module, image: str, resolved: ResolvedMapping, signer_image: str, arch: str
) -> dict[str, Any]:
    mounts = [
        {"name": "signing-key", "mountPath": KEY_PATH.rsplit("/", 1)[0], "readOnly": True},
        {"name": "signing-cert", "mountPath": CERT_PATH.rsplit("/", 1)[0], "readOnly": True},
        {"name": "scratch", "mountPath": "/tmp"},
    ]
    if module.spec.image_repo_secret is not None:
        mounts.append(
            {"name": "registry-auth", "mountPath": AUTH_PATH.rsplit("/", 1)[0], "readOnly": True}
        )
    return {
        "name": "sign",
        "image": signer_image,
        "args": signer_args(module, image, resolved, arch),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIGNER_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _secret_volume(volume: str, secret: str, key: str, path: str) -> dict[str, Any]:
    return {
        "name": volume,
        "secret": {
            "secretName": secret,
            "items": [{"key": key, "path": path}],
            "defaultMode": 0o440,
        },
    }
