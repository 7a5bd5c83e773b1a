"""Certificates and keys for a loopback control plane, made with openssl.

One CA signs a serving certificate for 127.0.0.1/localhost that the
apiserver, controller-manager, scheduler and the test registry all present, so
every client verifies TLS against ``ca.crt`` instead of turning checks off.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ADMIN_TOKEN_USER = "kmodkit-admin"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path, admin_token: str) -> None:
    """Write ca.crt/key, serving.crt/key, sa.key and tokens.csv into ``d`` (idempotent)."""
    d.mkdir(parents=True, exist_ok=True)
    if (d / "serving.crt").exists():
        return
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-subj",
        "/CN=kmodkit-devcluster-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=d,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "serving.key",
        "-out",
        "serving.csr",
        cwd=d,
    )
    issue_serving_cert(d, ("IP:127.0.0.1", "DNS:localhost"))
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    (d / "tokens.csv").write_text(f"{admin_token},{ADMIN_TOKEN_USER},uid-admin,system:masters\n")
    for key in ("ca.key", "serving.key", "sa.key", "tokens.csv"):
        (d / key).chmod(0o600)


def issue_serving_cert(d: Path, names: tuple[str, ...]) -> None:
    """(Re-)issue the apiserver's serving certificate from its key's request, for ``names``
    (subjectAltName entries such as ``IP:127.0.0.1``), signed by the cluster's CA."""
    (d / "serving.ext").write_text(
        f"subjectAltName={','.join(names)}\n"
        "extendedKeyUsage=serverAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "serving.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-extfile",
        "serving.ext",
        "-out",
        "serving.crt",
        cwd=d,
    )
