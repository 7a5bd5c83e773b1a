"""A real OCI registry (CNCF distribution) on loopback, with TLS and htpasswd or token auth."""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmodkit_dev import build, pki, procs, token_issuer


@dataclass(frozen=True)
class Registry:
    host: str  # host:port, as it appears in image references
    username: str
    password: str
    ca: Path | None  # None for plain HTTP
    pid: int
    log: Path
    issuer: token_issuer.TokenIssuer | None = None  # set for token auth

    @property
    def url(self) -> str:
        return f"{'https' if self.ca else 'http'}://{self.host}"

    def dockerconfigjson(self, host: str = "", password: str = "") -> str:
        """The body of a kubernetes.io/dockerconfigjson Secret for this registry (or for a
        front of it at ``host``; with another ``password`` to play a wrong one)."""
        password = password or self.password
        auth = base64.b64encode(f"{self.username}:{password}".encode()).decode()
        login = {"username": self.username, "password": password, "auth": auth}
        return json.dumps({"auths": {host or self.host: login}})

    def pull_secret(self, name: str) -> dict[str, Any]:
        """A kubernetes.io/dockerconfigjson Secret named ``name`` holding this registry's login."""
        return {
            "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {
                ".dockerconfigjson": base64.b64encode(self.dockerconfigjson().encode()).decode()
            },
        }

    def stop(self) -> None:
        procs.stop(self.pid, "registry")
        if self.issuer is not None:
            self.issuer.stop()

    def push(self, reference: str) -> None:
        """Push a small artifact as ``reference`` (host/repo:tag), as a build would.

        kwok runs no containers, so on the simulated cluster a build Job
        completes without pushing; tests and the demo push in its place.
        """
        import tempfile

        import oras.client

        # htpasswd challenges with Basic, token auth with a Bearer realm.
        c = oras.client.OrasClient(
            hostname=self.host,
            tls_verify=str(self.ca) if self.ca else False,
            auth_backend="basic" if self.issuer is None else "token",
            insecure=self.ca is None,
        )
        c.login(
            username=self.username,
            password=self.password,
            hostname=self.host,
            tls_verify=str(self.ca) if self.ca else False,
        )
        with tempfile.TemporaryDirectory() as tmp:
            payload = Path(tmp) / "module.txt"
            payload.write_text(reference)
            c.push(target=reference, files=[str(payload)], disable_path_validation=True)


def start(
    workdir: Path,
    username: str,
    password: str,
    tls: bool = True,
    pki_dir: Path | None = None,
    token_auth: bool = False,
    anonymous: tuple[str, ...] = (),
    access_log: bool = False,
) -> Registry:
    """Start a registry storing blobs under ``workdir``; TLS uses ``pki_dir``'s CA.

    With ``token_auth`` the registry trusts a token issuer started here (needs TLS),
    which grants everything to ``username`` and anonymous pulls of repositories
    under the ``anonymous`` prefixes; otherwise it checks an htpasswd file. With
    ``access_log`` every request is a line of its log (tests count uploads with it).
    """
    import bcrypt

    build.ensure(["registry"])
    workdir.mkdir(parents=True, exist_ok=True)
    # The registry ignores every hash type but bcrypt, and invents a random
    # password when the file is missing, so it is always written first.
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=8)).decode()
    (workdir / "htpasswd").write_text(f"{username}:{hashed}\n")
    port = procs.free_port()
    http: dict[str, object] = {"addr": f"127.0.0.1:{port}", "secret": os.urandom(16).hex()}
    ca = None
    if tls:
        pki_dir = pki_dir or workdir / "pki"
        pki.make_pki(pki_dir, admin_token="unused")
        http["tls"] = {
            "certificate": str(pki_dir / "serving.crt"),
            "key": str(pki_dir / "serving.key"),
        }
        ca = pki_dir / "ca.crt"
    issuer = None
    auth: dict[str, object] = {
        "htpasswd": {"realm": "kmodkit-test", "path": str(workdir / "htpasswd")}
    }
    if token_auth:
        if pki_dir is None:
            raise ValueError("token auth needs TLS: clients send credentials to the issuer")
        issuer = token_issuer.start(
            workdir / "token",
            username,
            password,
            anonymous,
            pki_dir / "serving.crt",
            pki_dir / "serving.key",
        )
        auth = {
            "token": {
                "realm": issuer.url,
                "service": token_issuer.SERVICE,
                "issuer": token_issuer.ISSUER,
                "rootcertbundle": str(issuer.certificate),
            }
        }
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": not access_log}},
        "storage": {
            "filesystem": {"rootdirectory": str(workdir / "data")},
            "delete": {"enabled": True},
        },
        "http": http,
        "auth": auth,
    }
    (workdir / "config.yml").write_text(json.dumps(config))
    # Without this, distribution v3 tries to export traces to localhost:4318.
    env = dict(os.environ, OTEL_TRACES_EXPORTER="none")
    log = workdir / "registry.log"
    pid = procs.spawn(
        [str(build.binary("registry")), "serve", str(workdir / "config.yml")], log, env
    )
    reg = Registry(f"127.0.0.1:{port}", username, password, ca, pid, log, issuer)
    try:
        _wait(reg)
    except BaseException:
        reg.stop()
        raise
    return reg


def _wait(reg: Registry, timeout: float = 30.0) -> None:
    ctx = ssl.create_default_context(cafile=str(reg.ca)) if reg.ca else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.runs(reg.pid, "registry"):
            raise RuntimeError(f"registry exited at start-up:\n{reg.log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{reg.url}/v2/", timeout=2, context=ctx)
        except urllib.error.HTTPError as e:
            if e.code == 401:  # up, and asking for credentials as configured
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"registry did not answer in {timeout:.0f}s; see {reg.log}")
