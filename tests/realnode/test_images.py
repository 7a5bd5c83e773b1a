"""The product's images: built with real buildah from the mmdebstrap base, pushed to a real
registry (TLS with the test CA, htpasswd auth), pulled back and run under chroot.

The first run on a machine builds every image (minutes); afterwards they come from
the content cache under ${KMODKIT_CACHE:-~/.cache/kmodkit}/images/. The Tenstorrent
images carry the stand-ins of kmodkit_dev/stand_ins/ for tt-smi, tt-flash and the udev
rule (GitHub is out of reach); their tests check our programs against those stand-ins.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kmodkit_dev import images
from kmodkit_dev import registry as devregistry
from tests.realnode import image_support as support

# What the chart and the operator's pod builders expect of each image.
CONTRACT = {
    "operator": {"Entrypoint": ["kmodkit"], "Cmd": ["run"], "User": "65532:65532"},
    "agent": {"Entrypoint": ["kmodkit-agent"], "User": ""},
    "signer": {"Entrypoint": ["kmodkit-sign"], "User": "65532:65532"},
    "builder": {"Entrypoint": ["/usr/local/bin/kmodkit-build"], "User": ""},
    "tenstorrent-builder": {"Entrypoint": ["/usr/local/bin/tt-builder"], "User": ""},
    "tenstorrent-flasher": {"Entrypoint": ["/usr/local/bin/tt-flash-node"], "User": ""},
}


@pytest.fixture(scope="module")
def destination(
    oci_registry: devregistry.Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[images.Destination]:
    assert oci_registry.ca is not None
    with images.login_file(oci_registry.host, oci_registry.username, oci_registry.password) as a:
        yield images.Destination(oci_registry.host, oci_registry.ca, a)


@pytest.fixture(scope="module")
def pushed(destination: images.Destination) -> dict[str, str]:
    return images.build_images(list(images.IMAGES), destination)


@pytest.fixture(scope="module")
def pulled(
    pushed: dict[str, str],
    destination: images.Destination,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, support.Pulled]:
    return {
        name: support.pull(ref, destination, tmp_path_factory.mktemp(name))
        for name, ref in pushed.items()
    }


def test_every_image_is_in_the_registry_by_its_digest(
    pushed: dict[str, str], pulled: dict[str, support.Pulled], destination: images.Destination
) -> None:
    assert set(pushed) == set(CONTRACT)
    for name, ref in pushed.items():
        assert ref.startswith(f"{destination.host}/kmodkit/{name}@sha256:"), ref
        assert pulled[name].digest == ref.rsplit("@", 1)[1], name


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_image_config_keeps_the_runtime_contract(
    name: str, pulled: dict[str, support.Pulled]
) -> None:
    config = pulled[name].config
    for key, want in CONTRACT[name].items():
        assert (config.get(key) or ([] if isinstance(want, list) else "")) == want, (name, key)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_image_keeps_no_apt_caches(name: str, pulled: dict[str, support.Pulled]) -> None:
    rootfs = pulled[name].rootfs
    left = [
        *rootfs.glob("var/cache/apt/*.bin"),
        *rootfs.glob("var/cache/apt/archives/*.deb"),
        *(p for p in rootfs.glob("var/lib/apt/lists/*") if p.name not in ("lock", "partial")),
        *rootfs.glob("usr/share/man/*"),
    ]
    assert left == [], name


def test_operator_runs_as_its_user(pulled: dict[str, support.Pulled]) -> None:
    done = support.run(pulled["operator"], ["kmodkit", "--help"])
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout
    # The chart mounts the root read-only: nothing may need writing but /tmp.
    assert not (pulled["operator"].rootfs / "opt/kmodkit/lib").stat().st_mode & 0o002


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        # What `kmodkit run` imports before it speaks to a cluster: the CLI, the runtime,
        # kopf, the clients and every backend it discovers.
        (
            "operator",
            [
                "python3",
                "-c",
                "import kmodkit.core.cli.main, kmodkit.core.runtime.operator;"
                "from kmodkit.core.runtime.plugins import discover; discover()",
            ],
        ),
        ("agent", ["kmodkit-agent", "--help"]),
        ("signer", ["kmodkit-sign", "--help"]),
    ],
)
def test_programs_start_from_the_images_bytecode(
    name: str, argv: list[str], pulled: dict[str, support.Pulled]
) -> None:
    """The images run with a read-only root: a module whose bytecode is not in the image is
    compiled on every start (seconds of CPU for the operator's, on each restart)."""
    # HOME as a container runtime sets it for a user without a passwd entry.
    done = support.run(pulled[name], argv, env={"PYTHONVERBOSE": "1", "HOME": "/"})
    said = [line for line in done.stderr.splitlines() if not line.startswith(("#", "import "))]
    assert done.returncode == 0, "\n".join(said[-40:])
    loaded = [line for line in done.stderr.splitlines() if line.startswith("# code object from")]
    compiled = [line for line in loaded if line.endswith(".py")]
    assert len(loaded) > 50, done.stderr[-2000:]
    assert compiled == [], compiled[:20]


def test_agent_runs_and_has_the_kmod_tools(pulled: dict[str, support.Pulled]) -> None:
    done = support.run(pulled["agent"], ["kmodkit-agent", "--help"])
    assert done.returncode == 0, done.stderr
    kmod = support.run(pulled["agent"], ["modprobe", "--version"])
    assert kmod.returncode == 0 and "kmod version 30" in kmod.stdout, kmod.stderr
    # The agent's own distribution only: not the operator, kopf or kubernetes.
    site = next((pulled["agent"].rootfs / "opt/kmodkit/lib").glob("python3*/site-packages"))
    assert not (site / "kopf").exists() and not (site / "kubernetes").exists()
    assert not (site / "kmodkit" / "core").exists()


def test_signer_runs_unprivileged_with_sign_file(pulled: dict[str, support.Pulled]) -> None:
    done = support.run(pulled["signer"], ["kmodkit-sign", "--help"])
    assert done.returncode == 0, done.stderr
    (sign_file,) = pulled["signer"].rootfs.glob("usr/lib/linux-kbuild-*/scripts/sign-file")
    assert sign_file.stat().st_mode & 0o111


def test_builder_runs_its_program_over_buildah(pulled: dict[str, support.Pulled]) -> None:
    done = support.run(pulled["builder"])  # its entrypoint, without the Job's arguments
    assert done.returncode == 2 and "--destination is required" in done.stderr, done
    buildah = support.run(pulled["builder"], ["buildah", "--version"])
    assert buildah.returncode == 0 and "buildah version" in buildah.stdout, buildah.stderr


def test_tenstorrent_builder_entrypoint_and_tools(pulled: dict[str, support.Pulled]) -> None:
    image = pulled["tenstorrent-builder"]
    done = support.run(image)  # its entrypoint, without the pod's environment
    assert done.returncode != 0 and "TT_KMD_VERSION must be set" in done.stderr, done
    assert support.run(image, ["kmodkit-agent", "--help"]).returncode == 0
    snapshot = support.run(image, ["tt-smi", "-s"])
    assert json.loads(snapshot.stdout)["device_info"], snapshot.stderr
    for tool in ("make", "gcc-12", "git", "curl", "python3", "/usr/local/bin/build-tt-kmd"):
        found = support.run(image, ["sh", "-c", f'command -v "{tool}"'])
        assert found.returncode == 0, tool
    assert (image.rootfs / "usr/local/share/tenstorrent/50-tenstorrent.rules").is_file()
    assert ("TT_SMI_VERSION=0.0.0-standin") in image.config["Env"]


def test_tenstorrent_flasher_reads_the_chips_back(pulled: dict[str, support.Pulled]) -> None:
    """tt-flash-node, run as the flash Job runs it, against the tt-smi stand-in: every chip
    already at the wanted version, so it downloads the bundle and flashes nothing."""
    image = pulled["tenstorrent-flasher"]
    (image.rootfs / "tmp" / "bundle.tar.gz").write_bytes(b"firmware")
    env = {
        "TT_FW_VERSION": "80.18.0",
        "TT_FW_BUNDLE_URL": "file:///tmp/bundle.tar.gz",
        "TT_FW_BUNDLE_PATH": "/tmp/fw.tar.gz",
        "TT_FW_READBACK": "80.18.0",
        "TT_SMI_STANDIN_FW_VERSIONS": "80.18.0 80.18.0",
    }
    done = support.run(image, env=env)
    assert done.returncode == 0, done.stderr
    assert "every chip already runs 80.18.0; nothing to flash" in done.stderr
    # The stand-in tt-flash reads the bundle first: this one is no bundle at all.
    flash = support.run(image, ["tt-flash", "--no-color", "flash", "--fw-tar", "/tmp/fw.tar.gz"])
    assert flash.returncode == 1 and "is not a firmware bundle" in flash.stderr, flash


def test_a_second_run_pushes_from_the_cache(
    pushed: dict[str, str], destination: images.Destination, tmp_path: Path
) -> None:
    buildah, log = support.counting_buildah(tmp_path)
    started = time.monotonic()
    again = images.build_images(list(images.IMAGES), destination, buildah=buildah)
    took = time.monotonic() - started
    assert support.calls(log) == []
    assert again == pushed
    print(f"warm run (cache hit, push of {len(again)} images): {took:.1f}s")


def test_a_changed_build_arg_is_a_miss(tmp_path: Path) -> None:
    """A test-only image (one RUN over the mmdebstrap base): a new value of its build
    argument builds again; the same value again is a hit."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "note.txt").write_text("copied\n")
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE_IMAGE=docker.io/library/debian:12.12-slim\n"
        "FROM ${BASE_IMAGE}\nARG NONCE\nCOPY note.txt /note.txt\n"
        'RUN echo "$NONCE" >/nonce\n'
    )
    buildah, log = support.counting_buildah(tmp_path)
    nonce = secrets.token_hex(8)
    tag = "kmodkit-test/nonce"
    first = images.build_image(dockerfile, context, {"NONCE": nonce}, tag, buildah=buildah)
    builds = [c for c in support.calls(log) if " bud " in f" {c} "]
    assert not first.cached and len(builds) == 1
    hit = images.build_image(dockerfile, context, {"NONCE": nonce}, tag, buildah=buildah)
    assert hit.cached and hit == images.Built(first.archive, first.digest, cached=True)
    assert len([c for c in support.calls(log) if " bud " in f" {c} "]) == 1
    other = images.build_image(dockerfile, context, {"NONCE": nonce + "x"}, tag, buildah=buildah)
    assert not other.cached and other.digest != first.digest
    assert len([c for c in support.calls(log) if " bud " in f" {c} "]) == 2
    # A context file it copies is an input too.
    (context / "note.txt").write_text("changed\n")
    changed = images.build_image(dockerfile, context, {"NONCE": nonce}, tag, buildah=buildah)
    assert not changed.cached
    for built in (first, other, changed):
        images.remove_cached(built)


def test_served_files_are_keyed_by_content(tmp_path: Path) -> None:
    """A file served on loopback for the build (as the Tenstorrent stand-ins are) reaches
    the RUN step, and its per-run URL does not make the next build a miss: the key holds
    the file's digest."""
    context = tmp_path / "context"
    context.mkdir()
    note = tmp_path / "note.txt"
    note.write_text(f"served note {secrets.token_hex(8)}\n")
    # The base has no curl: bash's /dev/tcp fetches it.
    (context / "fetch.sh").write_text(
        "rest=${NOTE_URL#http://}; host=${rest%%/*}\n"
        'exec 3<>"/dev/tcp/${host%:*}/${host#*:}"\n'
        'printf "GET /%s HTTP/1.0\\r\\n\\r\\n" "${rest#*/}" >&3\n'
        "cat <&3 >/note.http\n"
        "grep -q 'served note' /note.http\n"
        'test "${#NOTE_SHA256}" -eq 64\n'
    )
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE_IMAGE=docker.io/library/debian:12.12-slim\n"
        "FROM ${BASE_IMAGE}\nARG NOTE_URL\nARG NOTE_SHA256\n"
        "COPY fetch.sh /fetch.sh\nRUN bash -eu /fetch.sh\n"
    )
    served = {"NOTE_URL": images.Served(note, sha256_arg="NOTE_SHA256")}
    buildah, log = support.counting_buildah(tmp_path)
    tag = "kmodkit-test/served"
    first = images.build_image(dockerfile, context, {}, tag, served=served, buildah=buildah)
    again = images.build_image(dockerfile, context, {}, tag, served=served, buildah=buildah)
    assert not first.cached and again.cached
    assert len([c for c in support.calls(log) if " bud " in f" {c} "]) == 1
    images.remove_cached(first)


def test_cache_key_inputs() -> None:
    text = 'FROM x\nCOPY --chown=1:1 a b /dst/\nCOPY --from=w /wheels /w\nADD ["c", "/d"]\n'
    assert images.copied_sources(text) == ["a", "b", "c"]
    assert images.ignored("kmodkit/core/__pycache__/x.pyc", ["**/__pycache__"])
    assert not images.ignored("kmodkit/core/x.py", ["**/__pycache__", "**/*.pyc"])
    key = images.cache_key(b"FROM x", [("a", "1-")], {"A": "1"}, "sha256:b")
    assert key == images.cache_key(b"FROM x", [("a", "1-")], {"A": "1"}, "sha256:b")
    assert key != images.cache_key(b"FROM y", [("a", "1-")], {"A": "1"}, "sha256:b")
    assert key != images.cache_key(b"FROM x", [("a", "1x")], {"A": "1"}, "sha256:b")
    assert key != images.cache_key(b"FROM x", [("a", "1-")], {"A": "2"}, "sha256:b")
    assert key != images.cache_key(b"FROM x", [("a", "1-")], {"A": "1"}, "sha256:c")
