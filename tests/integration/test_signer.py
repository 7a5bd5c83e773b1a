"""``kmodkit-sign`` against a real registry, with the kernel's real sign-file and real keys.

The registry is CNCF distribution on loopback (TLS from a test CA, htpasswd or
token auth). sign-file comes from Debian's linux-kbuild, which the headers
``tests/kernel/prepare.sh modules`` installs bring in; the modules signed are our
test pair built against those headers. The unsigned images are pushed, and the
signed ones read back, by ``oci_images`` (not the product's client); ``modinfo``
reads the signatures. No control plane.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import secrets
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kmodkit.core.engine.registry import Credentials, ssl_context
from kmodkit.core.signer.oci import Registry, Reuse
from kmodkit_dev import registry as devregistry
from tests.integration.oci_images import Client, Member, digest, layer, layer_files
from tests.integration.signing_support import (
    MAGIC,
    SIGNER_CN,
    Kernel,
    Keys,
    extra_dir,
    make_keys,
    no_key_in,
    prepare_kernel,
    unsigned_layers,
)

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    termination: str

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines()]

    @property
    def error(self) -> str:
        last = self.lines[-1]
        assert last["event"] == "error", self.stdout
        return str(last["message"])


@pytest.fixture(scope="module")
def kernel() -> Kernel:
    return prepare_kernel()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devregistry.Registry]:
    workdir: Path = tmp_path_factory.mktemp("signer-registry")
    reg = devregistry.start(workdir, "kmodkit", secrets.token_urlsafe(16), access_log=True)
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def unsigned(registry: devregistry.Registry, kernel: Kernel) -> str:
    Client(registry).push_image("drivers/unsigned", kernel.version, unsigned_layers(kernel))
    return f"{registry.host}/drivers/unsigned:{kernel.version}"


def _sign(
    tmp_path: Path,
    reg: devregistry.Registry,
    keys: Keys,
    *args: str,
    password: str = "",
    ca: bool = True,
    docker_config: bool = True,
    logins: str = "",
) -> Run:
    config = tmp_path / "config.json"
    config.write_text(logins or reg.dockerconfigjson(password=password))
    termination = tmp_path / "termination-log"
    env = {k: v for k, v in os.environ.items() if k != "KMODKIT_REGISTRY_CA"}
    env["KMODKIT_TERMINATION_LOG"] = str(termination)
    if ca:
        env["KMODKIT_REGISTRY_CA"] = str(reg.ca)
    command = [
        sys.executable, "-m", "kmodkit.core.signer.cli",
        "--key", str(keys.key), "--cert", str(keys.cert),
        *(["--docker-config", str(config)] if docker_config else []),
        *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    return Run(
        done.returncode,
        done.stdout,
        done.stderr,
        termination.read_text() if termination.exists() else "",
    )


def _signed_layer(
    reg: devregistry.Registry, repository: str, tag: str
) -> tuple[dict[str, Any], bytes]:
    manifest, _ = Client(reg).manifest(repository, tag)
    return manifest, Client(reg).blob(repository, manifest["layers"][-1]["digest"])


def _modinfo(tmp_path: Path, content: bytes, field: str) -> str:
    module = tmp_path / f"m-{digest(content)[7:19]}.ko"
    module.write_bytes(content)
    return subprocess.run(
        ["modinfo", "-F", field, str(module)], check=True, capture_output=True, text=True
    ).stdout.strip()


def _requests(reg: devregistry.Registry) -> list[tuple[str, str, int]]:
    """(method, path with query, status) of every request in the registry's access log."""
    found = re.findall(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3})', reg.log.read_text())
    return [(method, path, int(status)) for method, path, status in found]


# -- signing ------------------------------------------------------------------------


def test_listed_modules_are_signed_into_one_new_layer_over_the_unsigned_ones(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    extra = extra_dir(kernel)
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/drivers/signed:{kernel.version}",
        "--file", f"/{extra}/kmodkit_test_dev.ko",
        "--file", f"/{extra}/kmodkit_test_dep.ko",
    )  # fmt: skip
    assert run.code == 0, run.stdout + run.stderr

    unsigned_manifest, _ = Client(registry).manifest("drivers/unsigned", kernel.version)
    manifest, top = _signed_layer(registry, "drivers/signed", kernel.version)
    assert manifest["layers"][:-1] == unsigned_manifest["layers"]
    assert len(manifest["layers"]) == len(unsigned_manifest["layers"]) + 1

    members = layer_files(top)
    files = {path for path, (info, _) in members.items() if info.isfile()}
    assert files == {f"{extra}/kmodkit_test_dev.ko", f"{extra}/kmodkit_test_dep.ko"}
    # Only the directories above them, with the modes and owners the image gives them.
    dirs = {
        path: (info.mode, info.uid, info.gid) for path, (info, _) in members.items() if info.isdir()
    }
    assert dirs == {
        "opt": (0o755, 0, 0),
        "opt/lib": (0o755, 0, 0),
        "opt/lib/modules": (0o755, 0, 0),
        f"opt/lib/modules/{kernel.version}": (0o755, 0, 0),
        extra: (0o750, 1000, 1001),
    }
    dev_info, _ = members[f"{extra}/kmodkit_test_dev.ko"]
    assert (dev_info.mode, dev_info.uid, dev_info.gid) == (0o640, 1000, 1001)
    for original, (_, signed) in (
        (kernel.dev, members[f"{extra}/kmodkit_test_dev.ko"]),
        (kernel.dep, members[f"{extra}/kmodkit_test_dep.ko"]),
    ):
        assert signed is not None
        assert signed.startswith(original) and signed.endswith(MAGIC)
        assert _modinfo(tmp_path, signed, "signer") == SIGNER_CN
        assert _modinfo(tmp_path, signed, "sig_key") == keys.serial
        assert _modinfo(tmp_path, signed, "sig_hashalgo") == "sha256"

    config = json.loads(Client(registry).blob("drivers/signed", manifest["config"]["digest"]))
    top_diff_id = digest(gzip.decompress(top))
    assert config["rootfs"]["diff_ids"][-1] == top_diff_id
    assert len(config["rootfs"]["diff_ids"]) == 3
    assert config["history"][-1]["created_by"] == "kmodkit-sign: 2 signed modules"
    assert config["config"] == {"Env": ["PATH=/usr/bin"]}

    lines = run.lines
    assert all(line["level"] == "info" for line in lines)
    signed_lines = [line for line in lines if line["event"] == "signed"]
    assert [line["path"] for line in signed_lines] == [
        f"/{extra}/kmodkit_test_dep.ko",
        f"/{extra}/kmodkit_test_dev.ko",
    ]
    assert all(
        line["signer"] == SIGNER_CN and line["serial"] == keys.serial for line in signed_lines
    )
    _, pushed_digest = Client(registry).manifest("drivers/signed", kernel.version)
    assert lines[-1] == {**lines[-1], "event": "done", "digest": pushed_digest}


def test_no_pushed_blob_and_no_log_line_holds_the_private_key(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/drivers/scanned:{kernel.version}",
        "--file", f"/{extra_dir(kernel)}/*.ko",
    )  # fmt: skip
    assert run.code == 0, run.stdout + run.stderr
    client = Client(registry)
    manifest, _ = client.manifest("drivers/scanned", kernel.version)
    blobs = [manifest["config"]["digest"], *(d["digest"] for d in manifest["layers"])]
    for blob_digest in blobs:
        data = client.blob("drivers/scanned", blob_digest)
        no_key_in(data, keys, f"blob {blob_digest}")
        if data[:2] == b"\x1f\x8b":
            no_key_in(zlib.decompress(data, 31), keys, f"blob {blob_digest}, uncompressed")
    # Also every blob the registry stores, whatever manifest names it.
    for stored in (registry.log.parent / "data").rglob("data"):
        if stored.is_file():
            no_key_in(stored.read_bytes(), keys, str(stored))
    no_key_in((run.stdout + run.stderr).encode(), keys, "the output")


def test_a_glob_signs_what_it_matches_and_not_what_a_whiteout_deleted(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/drivers/globbed:{kernel.version}",
        "--file", "/opt/lib/modules/*/extra/*.ko",
    )  # fmt: skip
    assert run.code == 0, run.stdout + run.stderr
    _, top = _signed_layer(registry, "drivers/globbed", kernel.version)
    files = {path for path, (info, _) in layer_files(top).items() if info.isfile()}
    extra = extra_dir(kernel)
    assert files == {f"{extra}/kmodkit_test_dev.ko", f"{extra}/kmodkit_test_dep.ko"}


def test_an_entry_that_matches_nothing_fails_naming_it_and_the_modules_held(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    extra = extra_dir(kernel)
    for entry in ("/opt/lib/modules/*/extra/missing*.ko", f"/{extra}/old.ko"):
        run = _sign(
            tmp_path,
            registry,
            keys,
            "--unsigned-image", unsigned,
            "--image", f"{registry.host}/drivers/never:{kernel.version}",
            "--file", f"/{extra}/kmodkit_test_dev.ko",
            "--file", entry,
        )  # fmt: skip
        assert run.code == 1, run.stdout
        assert run.error == (
            f"--file {entry} matches no file in the image; the image holds these .ko files: "
            f"/{extra}/kmodkit_test_dep.ko, /{extra}/kmodkit_test_dev.ko"
        )
        assert run.termination == run.error
    with pytest.raises(Exception, match="404"):
        Client(registry).manifest("drivers/never", kernel.version)


def test_a_wrong_password_fails_naming_the_user_and_never_the_password(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    wrong = "wrong-" + secrets.token_urlsafe(12)
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/drivers/wrong:{kernel.version}",
        "--file", f"/{extra_dir(kernel)}/*.ko",
        password=wrong,
    )  # fmt: skip
    assert run.code == 1
    assert run.error.startswith(
        f"registry {registry.host} refused the login of user 'kmodkit' from {tmp_path}/config.json"
    ), run.error
    assert run.termination == run.error
    everything = run.stdout + run.stderr + run.termination
    assert wrong not in everything
    assert registry.password not in everything


def test_tls_is_verified_unless_skipped_for_that_direction(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    args = (
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/drivers/tls:{kernel.version}",
        "--file", f"/{extra_dir(kernel)}/*.ko",
    )  # fmt: skip
    run = _sign(tmp_path, registry, keys, *args, ca=False)
    assert run.code == 1
    assert run.error.startswith(f"cannot verify the TLS certificate of registry {registry.host}")
    assert "KMODKIT_REGISTRY_CA" in run.error
    # Skipping the check for the pull only gets as far as the push.
    run = _sign(tmp_path, registry, keys, *args, "--skip-tls-verify-pull", ca=False)
    assert run.code == 1
    assert [line["event"] for line in run.lines][-2] == "signed"
    assert run.error.startswith(f"cannot verify the TLS certificate of registry {registry.host}")
    run = _sign(
        tmp_path, registry, keys, *args, "--skip-tls-verify-pull", "--skip-tls-verify", ca=False
    )
    assert run.code == 0, run.stdout


def test_an_index_gives_the_manifest_of_the_platform_asked_for(
    tmp_path: Path, registry: devregistry.Registry, kernel: Kernel, keys: Keys
) -> None:
    client = Client(registry)
    extra = extra_dir(kernel)
    pushed = []
    for arch in ("amd64", "arm64"):
        marker = layer([Member(f"opt/{arch}", b"")])
        d, size = client.push_image(
            "drivers/multi", f"{arch}-only", [*unsigned_layers(kernel), marker], arch
        )
        pushed.append((d, size, arch))
    client.push_index("drivers/multi", "index", pushed)
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", f"{registry.host}/drivers/multi:index",
        "--image", f"{registry.host}/drivers/multi:signed-arm64",
        "--platform", "linux/arm64",
        "--file", f"/{extra}/*.ko",
    )  # fmt: skip
    assert run.code == 0, run.stdout
    arm64, _ = client.manifest("drivers/multi", "arm64-only")
    signed, _ = client.manifest("drivers/multi", "signed-arm64")
    assert signed["layers"][:-1] == arm64["layers"]
    config = json.loads(client.blob("drivers/multi", signed["config"]["digest"]))
    assert config["architecture"] == "arm64"

    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", f"{registry.host}/drivers/multi:index",
        "--image", f"{registry.host}/drivers/multi:signed-s390x",
        "--platform", "linux/s390x",
        "--file", f"/{extra}/*.ko",
    )  # fmt: skip
    assert run.code == 1
    assert "no manifest for linux/s390x (it has: linux/amd64, linux/arm64)" in run.error


def test_unsigned_layers_are_mounted_not_uploaded_and_a_second_run_pushes_nothing_new(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    unsigned_manifest, _ = Client(registry).manifest("drivers/unsigned", kernel.version)
    layer_digests = [d["digest"] for d in unsigned_manifest["layers"]]
    before = len(_requests(registry))
    args = (
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/other/reused:{kernel.version}",
        "--file", f"/{extra_dir(kernel)}/*.ko",
    )  # fmt: skip
    run = _sign(tmp_path, registry, keys, *args)
    assert run.code == 0, run.stdout
    reuse = [(line["digest"], line["reuse"]) for line in run.lines if line["event"] == "layer"]
    assert reuse[:2] == [(d, "mounted") for d in layer_digests]
    assert reuse[2][1] == "uploaded"
    requests = _requests(registry)[before:]
    mounts = [p for m, p, s in requests if m == "POST" and "mount=" in p and s == 201]
    assert len(mounts) == 2 and all("from=drivers%2Funsigned" in p for p in mounts)
    uploads = [p for m, p, _ in requests if m in ("PUT", "PATCH") and "/blobs/uploads/" in p]
    assert not [p for p in uploads for d in layer_digests if d.replace(":", "%3A") in p or d in p]
    assert len(uploads) == 2  # the signed layer and the config

    again = _sign(tmp_path, registry, keys, *args)
    assert again.code == 0, again.stdout
    reuse = [line["reuse"] for line in again.lines if line["event"] == "layer"]
    assert reuse == ["present", "present", "present"]
    assert again.lines[-1]["digest"] == run.lines[-1]["digest"]


def test_a_token_registry_gives_a_token_for_pull_and_push(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, kernel: Kernel, keys: Keys
) -> None:
    reg = devregistry.start(
        tmp_path_factory.mktemp("signer-token-registry"),
        "kmodkit",
        secrets.token_urlsafe(16),
        token_auth=True,
    )
    try:
        Client(reg).push_image("private/unsigned", kernel.version, unsigned_layers(kernel))
        assert reg.issuer is not None
        reg.issuer.requests.clear()
        run = _sign(
            tmp_path,
            reg,
            keys,
            "--unsigned-image", f"{reg.host}/private/unsigned:{kernel.version}",
            "--image", f"{reg.host}/private/signed:{kernel.version}",
            "--file", f"/{extra_dir(kernel)}/kmodkit_test_dev.ko",
        )  # fmt: skip
        assert run.code == 0, run.stdout
        # One token for the pull, one for the push and the mounts: asked for up front, so no
        # request is refused and sent again.
        assert reg.issuer.requests == [
            ("kmodkit", ["repository:private/unsigned:pull"]),
            (
                "kmodkit",
                ["repository:private/signed:pull,push", "repository:private/unsigned:pull"],
            ),
        ]
        reuse = [line["reuse"] for line in run.lines if line["event"] == "layer"]
        assert reuse == ["mounted", "mounted", "uploaded"]
        signed, _ = Client(reg).manifest("private/signed", kernel.version)
        assert len(signed["layers"]) == 3

        run = _sign(
            tmp_path,
            reg,
            keys,
            "--unsigned-image", f"{reg.host}/private/unsigned:{kernel.version}",
            "--image", f"{reg.host}/private/signed:{kernel.version}",
            "--file", f"/{extra_dir(kernel)}/kmodkit_test_dev.ko",
            docker_config=False,
        )  # fmt: skip
        assert run.code == 1
        assert run.error.startswith(f"registry {reg.host} requires a login")
    finally:
        reg.stop()


def test_the_signed_layer_is_a_plain_tar_the_runtime_can_apply(
    tmp_path: Path, registry: devregistry.Registry, unsigned: str, kernel: Kernel, keys: Keys
) -> None:
    """The layers, applied in order by Python's tarfile as a runtime would, give the
    signed modules at their paths and the rest of the image untouched."""
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", unsigned,
        "--image", f"{registry.host}/drivers/applied:{kernel.version}",
        "--file", f"/{extra_dir(kernel)}/kmodkit_test_dev.ko",
    )  # fmt: skip
    assert run.code == 0, run.stdout
    client = Client(registry)
    manifest, _ = client.manifest("drivers/applied", kernel.version)
    root = tmp_path / "root"
    root.mkdir()
    for descriptor in manifest["layers"]:
        with tarfile.open(
            fileobj=io.BytesIO(client.blob("drivers/applied", descriptor["digest"]))
        ) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if name.name.startswith(".wh."):
                    (root / name.parent / name.name[4:]).unlink()
                    continue
                tar.extract(member, root, filter="fully_trusted")
    extra = root / extra_dir(kernel)
    assert (extra / "kmodkit_test_dev.ko").read_bytes().endswith(MAGIC)
    assert (extra / "kmodkit_test_dep.ko").read_bytes() == kernel.dep
    assert not (extra / "old.ko").exists()
    assert (root / "opt/README").read_bytes() == b"not a module\n"


def test_a_mount_the_token_does_not_cover_gets_a_wider_token_and_is_not_refused(
    tmp_path_factory: pytest.TempPathFactory, kernel: Kernel
) -> None:
    """The client asked for push on the target alone: the registry's 401 names the
    source's pull scope too, and the client asks for a token with it once."""
    reg = devregistry.start(
        tmp_path_factory.mktemp("signer-widen-registry"),
        "kmodkit",
        secrets.token_urlsafe(16),
        token_auth=True,
    )
    try:
        data = unsigned_layers(kernel)[1]
        Client(reg).push_blob("source/repo", data)
        assert reg.issuer is not None and reg.ca is not None
        reg.issuer.requests.clear()
        client = Registry(
            reg.host,
            Credentials(reg.username, reg.password),
            ssl_context(None, str(reg.ca)),
            plain_http=False,
            scopes=("repository:target/repo:pull,push",),
        )
        assert client.push_blob("target/repo", digest(data), len(data), data, "source/repo") is (
            Reuse.MOUNTED
        )
        assert [scopes for _, scopes in reg.issuer.requests] == [
            ["repository:target/repo:pull,push"],
            ["repository:target/repo:pull,push", "repository:source/repo:pull"],
        ]
    finally:
        reg.stop()


def test_to_another_registry_the_unsigned_layers_are_uploaded_and_read_back_whole(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    registry: devregistry.Registry,
    unsigned: str,
    kernel: Kernel,
    keys: Keys,
) -> None:
    assert registry.ca is not None
    other = devregistry.start(
        tmp_path_factory.mktemp("signer-other-registry"),
        "kmodkit",
        secrets.token_urlsafe(16),
        pki_dir=registry.ca.parent,  # the same test CA, so one KMODKIT_REGISTRY_CA serves both
        access_log=True,
    )
    try:
        auths = {
            **json.loads(registry.dockerconfigjson())["auths"],
            **json.loads(other.dockerconfigjson())["auths"],
        }
        run = _sign(
            tmp_path,
            registry,
            keys,
            "--unsigned-image", unsigned,
            "--image", f"{other.host}/drivers/signed:{kernel.version}",
            "--file", f"/{extra_dir(kernel)}/*.ko",
            logins=json.dumps({"auths": auths}),
        )  # fmt: skip
        assert run.code == 0, run.stdout
        reuse = [line["reuse"] for line in run.lines if line["event"] == "layer"]
        assert reuse == ["uploaded", "uploaded", "uploaded"]
        unsigned_manifest, _ = Client(registry).manifest("drivers/unsigned", kernel.version)
        signed, _ = Client(other).manifest("drivers/signed", kernel.version)
        assert signed["layers"][:-1] == unsigned_manifest["layers"]
        for descriptor in signed["layers"]:  # Client.blob checks each digest
            assert (
                len(Client(other).blob("drivers/signed", descriptor["digest"]))
                == (descriptor["size"])
            )
        # No mount is tried across registries.
        assert not [p for m, p, _ in _requests(other) if m == "POST" and "mount=" in p]
    finally:
        other.stop()


def test_plain_http_is_used_only_when_chosen(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, kernel: Kernel, keys: Keys
) -> None:
    plain = devregistry.start(
        tmp_path_factory.mktemp("signer-plain-registry"),
        "kmodkit",
        secrets.token_urlsafe(16),
        tls=False,
    )
    try:
        Client(plain).push_image("drivers/unsigned", kernel.version, unsigned_layers(kernel))
        args = (
            "--unsigned-image", f"{plain.host}/drivers/unsigned:{kernel.version}",
            "--image", f"{plain.host}/drivers/signed:{kernel.version}",
            "--file", f"/{extra_dir(kernel)}/*.ko",
        )  # fmt: skip
        run = _sign(tmp_path, plain, keys, *args, ca=False)
        assert run.code == 1
        assert run.error == (
            f"cannot talk TLS to registry {plain.host} (the API): WRONG_VERSION_NUMBER; if it "
            "serves plain HTTP, choose that for it (--insecure for --image, --insecure-pull "
            "for --unsigned-image)"
        )
        run = _sign(tmp_path, plain, keys, *args, "--insecure-pull", "--insecure", ca=False)
        assert run.code == 0, run.stdout
        signed, _ = Client(plain).manifest("drivers/signed", kernel.version)
        assert len(signed["layers"]) == 3
    finally:
        plain.stop()


def test_a_docker_schema_2_image_gives_a_docker_schema_2_signed_image_without_history(
    tmp_path: Path, registry: devregistry.Registry, kernel: Kernel, keys: Keys
) -> None:
    client = Client(registry)
    client.push_image(
        "drivers/docker", "unsigned", unsigned_layers(kernel), history=False, docker=True
    )
    run = _sign(
        tmp_path,
        registry,
        keys,
        "--unsigned-image", f"{registry.host}/drivers/docker:unsigned",
        "--image", f"{registry.host}/drivers/docker:signed",
        "--file", f"/{extra_dir(kernel)}/kmodkit_test_dev.ko",
    )  # fmt: skip
    assert run.code == 0, run.stdout
    signed, _ = client.manifest("drivers/docker", "signed")
    assert signed["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert signed["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
    assert {d["mediaType"] for d in signed["layers"]} == {
        "application/vnd.docker.image.rootfs.diff.tar.gzip"
    }
    config = json.loads(client.blob("drivers/docker", signed["config"]["digest"]))
    assert "history" not in config and len(config["rootfs"]["diff_ids"]) == 3
