"""The registry client against a real registry (CNCF distribution) on loopback.

No Kubernetes control plane: only the registry, its token issuer and the
loopback fronts of registry_fronts.py (redirects, 5xx, stalls). The
registries users meet (Docker Hub, GHCR, quay, nvcr, registry.k8s.io) are
never contacted; these tests play their behaviours: anonymous tokens for
public repositories, tokens with credentials for private ones, redirects to
another host.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kmodkit.core.api import RegistryTLS
from kmodkit.core.engine.build_plan import BuildSettings
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Credentials, Existence, check
from kmodkit.core.nodes import NodeView
from kmodkit.core.runtime.kube import api_message
from kmodkit.core.runtime.module_controller import ModuleController, ModuleControllerSettings
from kmodkit.core.runtime.watch_cache import Shared
from kmodkit.core.runtime.writes import WritePool
from kmodkit_dev import pki
from kmodkit_dev import registry as devregistry
from tests.integration import registry_fronts
from tests.integration.registry_fronts import Front, Mode
from tests.unit.examples import minimal

# Fault tests must end well inside a minute; without a deadline they would hang.
pytestmark = pytest.mark.timeout(60)

USER = "kmodkit"
KERNEL = "6.8.0-45-generic"


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devregistry.Registry]:
    workdir: Path = tmp_path_factory.mktemp("token-registry")
    reg = devregistry.start(
        workdir, USER, secrets.token_urlsafe(16), token_auth=True, anonymous=("public/",)
    )
    try:
        for image in ("public/xe:1", "private/xe:1", f"public/k8s/xe:{KERNEL}"):
            reg.push(f"{reg.host}/{image}")
        yield reg
    finally:
        reg.stop()


@pytest.fixture
def front(token_registry: devregistry.Registry) -> Iterator[Front]:
    assert token_registry.ca is not None
    pki_dir = token_registry.ca.parent
    f = registry_fronts.start(
        pki_dir / "serving.crt", pki_dir / "serving.key", token_registry.host, token_registry.ca
    )
    yield f
    f.stop()


def _login(reg: devregistry.Registry, password: str | None = None) -> Credentials:
    return Credentials(reg.username, password or reg.password)


def _ask(reg: devregistry.Registry, image: str, login: Credentials | None = None) -> Answer:
    return check(image, login, None, str(reg.ca), timeout=5)


# -- token auth ----------------------------------------------------------------------


def test_a_public_image_resolves_with_an_anonymous_token(
    token_registry: devregistry.Registry,
) -> None:
    reg = token_registry
    assert reg.issuer is not None
    asked = len(reg.issuer.requests)
    assert _ask(reg, f"{reg.host}/public/xe:1") == Answer(Existence.EXISTS)
    assert _ask(reg, f"{reg.host}/public/xe:2") == Answer(Existence.MISSING)
    # Both answers needed a token, asked for without credentials.
    assert reg.issuer.requests[asked:] == [(None, ["repository:public/xe:pull"])] * 2


def test_a_private_image_needs_the_login_and_says_so(token_registry: devregistry.Registry) -> None:
    reg = token_registry
    anonymous = _ask(reg, f"{reg.host}/private/xe:1")
    assert anonymous.existence is Existence.UNKNOWN
    assert anonymous.detail == (
        f"registry {reg.host} requires authentication and no credentials for it in imageRepoSecret"
    )
    assert _ask(reg, f"{reg.host}/private/xe:1", _login(reg)) == Answer(Existence.EXISTS)
    assert _ask(reg, f"{reg.host}/private/xe:2", _login(reg)) == Answer(Existence.MISSING)
    refused = _ask(reg, f"{reg.host}/private/xe:1", _login(reg, "wrong"))
    assert refused.existence is Existence.UNKNOWN
    assert "credentials in imageRepoSecret were refused" in refused.detail
    assert "wrong" not in refused.detail and reg.password not in refused.detail


def test_basic_auth_registry(oci_registry: devregistry.Registry) -> None:
    # The session's htpasswd registry challenges with Basic, not a token realm.
    reg = oci_registry
    reg.push(f"{reg.host}/kmods/basic:1")
    assert _ask(reg, f"{reg.host}/kmods/basic:1", _login(reg)) == Answer(Existence.EXISTS)
    assert _ask(reg, f"{reg.host}/kmods/basic:1").existence is Existence.UNKNOWN


# -- redirects -----------------------------------------------------------------------


def test_a_redirect_to_another_host_is_followed_and_gets_its_own_anonymous_token(
    token_registry: devregistry.Registry, front: Front
) -> None:
    # As registry.k8s.io: the front answers 307 to storage elsewhere, under another path.
    reg = token_registry
    assert reg.issuer is not None
    front.mode, front.prefix = Mode.REDIRECT, "public/"
    asked = len(reg.issuer.requests)
    login = _login(reg)
    assert _ask(reg, f"{front.host}/k8s/xe:{KERNEL}", login) == Answer(Existence.EXISTS)
    assert _ask(reg, f"{front.host}/k8s/xe:nope", login) == Answer(Existence.MISSING)
    # The Module's login belongs to the front; the host it redirects to never gets it.
    assert reg.issuer.requests[asked:] == [(None, ["repository:public/k8s/xe:pull"])] * 2


def test_a_redirect_to_a_private_repository_elsewhere_says_the_login_stays_home(
    token_registry: devregistry.Registry, front: Front
) -> None:
    front.mode, front.prefix = Mode.REDIRECT, "private/"
    answer = _ask(token_registry, f"{front.host}/xe:1", _login(token_registry))
    assert answer.existence is Existence.UNKNOWN
    assert answer.detail == (
        f"registry {front.host} redirected to {token_registry.host}, which requires "
        "authentication; imageRepoSecret logins are sent only to the registry the image names"
    )


@pytest.mark.parametrize(
    ("mode", "detail"),
    [
        (Mode.REDIRECT_HTTP, "redirected to a http address; only HTTPS is followed"),
        (Mode.LOOP, "redirected more than 5 times"),
    ],
)
def test_unsafe_or_endless_redirects_are_not_followed(
    token_registry: devregistry.Registry, front: Front, mode: Mode, detail: str
) -> None:
    front.mode = mode
    answer = _ask(token_registry, f"{front.host}/public/xe:1")
    assert answer.existence is Existence.UNKNOWN
    assert detail in answer.detail
    assert front.requests == (6 if mode is Mode.LOOP else 1)


def test_a_password_in_a_redirect_never_reaches_a_detail(tmp_path: Path) -> None:
    # The front redirects to a loopback port nothing listens on, naming a password in the URL.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    pki_dir = tmp_path / "pki"
    pki.make_pki(pki_dir, admin_token="unused")
    f = registry_fronts.start(
        pki_dir / "serving.crt", pki_dir / "serving.key", closed, pki_dir / "ca.crt"
    )
    try:
        f.mode = Mode.REDIRECT_USERINFO
        answer = check(f"{f.host}/xe:1", None, None, str(pki_dir / "ca.crt"), timeout=5)
    finally:
        f.stop()
    assert answer == Answer(
        Existence.UNKNOWN, f"cannot reach {closed} (for registry {f.host}): Connection refused"
    )


# -- faults --------------------------------------------------------------------------


def test_through_a_proxy_the_image_resolves(
    token_registry: devregistry.Registry, front: Front
) -> None:
    # The fronts below fail; this one passes through, so their failures are theirs.
    assert _ask(token_registry, f"{front.host}/public/xe:1") == Answer(Existence.EXISTS)


def test_a_5xx_is_unknown_at_once_with_no_retry(
    token_registry: devregistry.Registry, front: Front
) -> None:
    front.mode, front.status = Mode.STATUS, 503
    answer = _ask(token_registry, f"{front.host}/public/xe:1", _login(token_registry))
    assert answer == Answer(Existence.UNKNOWN, f"registry {front.host} answered HTTP 503")
    assert front.requests == 1


@pytest.mark.parametrize("mode", [Mode.STALL, Mode.TRICKLE])
def test_a_stalled_or_trickling_registry_is_cut_at_the_deadline(
    token_registry: devregistry.Registry, front: Front, mode: Mode
) -> None:
    front.mode = mode
    started = time.monotonic()
    answer = check(f"{front.host}/public/xe:1", None, None, str(token_registry.ca), timeout=1)
    took = time.monotonic() - started
    assert answer == Answer(Existence.UNKNOWN, f"registry {front.host} did not answer within 1s")
    # The deadline is the behaviour under test: a trickle renews every socket timeout.
    assert took < 5


def test_an_unreachable_registry_is_unknown_with_the_reason(
    token_registry: devregistry.Registry,
) -> None:
    reg = token_registry
    # A loopback port nothing listens on: bind one, note it, close it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = _ask(reg, f"127.0.0.1:{port}/public/xe:1")
    assert answer == Answer(
        Existence.UNKNOWN, f"cannot reach registry 127.0.0.1:{port}: Connection refused"
    )


# -- TLS trust -------------------------------------------------------------------------


def test_the_extra_ca_is_added_to_the_system_trust_store(
    token_registry: devregistry.Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A "system" CA of our own (OpenSSL reads SSL_CERT_FILE for its default store) signs a
    # public-looking front; KMODKIT_REGISTRY_CA is the private registry's CA. The front
    # redirects to the registry, so one check needs both.
    system = tmp_path / "system-pki"
    pki.make_pki(system, admin_token="unused")
    monkeypatch.setenv("SSL_CERT_FILE", str(system / "ca.crt"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "no-certs-here"))
    assert token_registry.ca is not None
    f = registry_fronts.start(
        system / "serving.crt", system / "serving.key", token_registry.host, token_registry.ca
    )
    try:
        f.mode, f.prefix = Mode.REDIRECT, "public/"
        image = f"{f.host}/xe:1"
        assert _ask(token_registry, image) == Answer(Existence.EXISTS)
        # Without the extra CA the registry behind the redirect is not trusted.
        unverified = check(image, None, None, None, timeout=5)
        assert unverified.existence is Existence.UNKNOWN
        assert f"cannot verify the TLS certificate of {token_registry.host}" in unverified.detail
        # insecureSkipTLSVerify still turns verification off, for both.
        skip = RegistryTLS.model_validate({"insecureSkipTLSVerify": True})
        assert check(image, None, skip, None, timeout=5) == Answer(Existence.EXISTS)
    finally:
        f.stop()


# -- through the controller, to status --------------------------------------------------


class StatusKube:
    """Stand-in for kmodkit.core.runtime.kube.Kube: one pull secret, recorded status writes."""

    def __init__(self, secret: Mapping[str, str]) -> None:
        # One write at a time, as recorded: the order the pass hands them over.
        self.writes = WritePool(1, api_message)
        self.secret = dict(secret)
        self.statuses: list[Mapping[str, Any]] = []

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.secret

    def write_status(self, *args: Any) -> None:
        self.statuses.append(args[-1])

    def label_node(self, node: str, change: Mapping[str, str | None]) -> None:
        pass


def test_a_registry_fault_reaches_status_and_is_not_asked_again_each_pass(
    token_registry: devregistry.Registry, front: Front
) -> None:
    reg = token_registry
    front.mode, front.status = Mode.STATUS, 502
    config = {"auths": {front.host: {"username": reg.username, "password": reg.password}}}
    kube = StatusKube({".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()})
    shared = Shared(kube=kube, operator_namespace="kmodkit-system", nodes_synced=True)  # type: ignore[arg-type]
    shared.nodes["a"] = NodeView("a", {}, KERNEL)
    controller = ModuleController(
        shared,
        ModuleControllerSettings(
            loader=LoaderSettings(agent_image="registry.example.com/agent:1"),
            build=BuildSettings(builder_image="registry.example.com/builder:1"),
            registry_ca_bundle=str(reg.ca),
            registry_timeout_seconds=5,
        ),
    )
    body = minimal(
        kernelMappings=[{"literal": KERNEL, "containerImage": f"{front.host}/public/xe:1"}]
    )
    body["spec"]["imageRepoSecret"] = {"name": "pull"}
    controller.reconcile(body, [], [])
    controller.reconcile(body, [], [])
    assert front.requests == 1  # the second pass took the backed-off answer
    progressing = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Progressing")
    assert progressing["message"] == (
        f"1 nodes loading, updating or waiting for an image; cannot tell yet whether "
        f"{front.host}/public/xe:1 exists: registry {front.host} answered HTTP 502"
    )
    assert reg.password not in json.dumps(kube.statuses)
