"""The product's images, built here from Debian's archive and pushed to a devcluster registry.

The base is a minbase Debian root filesystem made with mmdebstrap and imported with
buildah; every Dockerfile in ``dockerfiles/`` builds FROM it (``--build-arg
BASE_IMAGE``) with buildah, daemonless (``--isolation chroot``). A result is kept as
an oci-archive under ``${KMODKIT_CACHE:-~/.cache/kmodkit}/images/``, keyed by a digest
of what decides it (the Dockerfile, the context files it copies, the build
arguments, the base's digest), so a warm run pushes from the cache (skopeo) without
calling buildah. A build writes into a scratch directory renamed into place under a
file lock, as ``kmodkit_dev.build`` does, so an interrupted build leaves no half cache.

    python -m kmodkit_dev.images [name...] --registry HOST:PORT [--ca FILE] [--authfile FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import functools
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kmodkit_dev.build import cache_root
from kmodkit_dev.repo import ROOT

Echo = Callable[[str], None]

SUITE = "bookworm"
MIRRORS = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
# What Debian's slim images leave out, for the base and every package installed on it
# later (the rules stay in /etc/dpkg/dpkg.cfg.d/): docs but their copyright, manuals,
# translations.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/lintian/*",
)
# apt keeps no package caches or downloaded packages (80 MB an image otherwise), as in
# Debian's own images; copied into the base's /etc/apt/apt.conf.d/ on import (mmdebstrap
# itself needs the downloads, and its cleanup misses the caches once they are renamed).
APT_CONF = """\
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Keep-Downloaded-Packages "false";
Acquire::Languages "none";
"""
# The base's PATH and command, as Debian's own images set them.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where a build's RUN steps find the host's CA bundle (the Dockerfiles' PIP_CERT).
BUILD_CA = "/run/kmodkit-build/ca.crt"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Bumped when the way an image is made changes in a way its inputs do not show.
FORMAT = 2
STAND_INS = Path(__file__).parent / "stand_ins"


class ImageError(RuntimeError):
    """An image could not be made or pushed; the message names it and the tool's words."""


@dataclass(frozen=True)
class Served:
    """A build argument whose value points at a local file, served on loopback for the
    build. ``value`` is formatted with the file's ``url`` and ``sha256``; the cache key
    holds the file's digest, not the (per-run) URL. ``sha256_arg``, when set, is another
    build argument that receives the digest."""

    path: Path
    value: str = "{url}"
    sha256_arg: str = ""


@dataclass(frozen=True)
class ImageSpec:
    dockerfile: Path
    context: Path
    args: Mapping[str, str] = field(default_factory=dict)
    served: Mapping[str, Served] = field(default_factory=dict)


_TT_SMI = Served(STAND_INS / "tt-smi", sha256_arg="TT_SMI_SHA256")

# name -> how it is built; the registry repository is kmodkit/<name>.
IMAGES: dict[str, ImageSpec] = {
    "operator": ImageSpec(ROOT / "dockerfiles/operator/Dockerfile", ROOT),
    "agent": ImageSpec(ROOT / "dockerfiles/agent/Dockerfile", ROOT),
    "signer": ImageSpec(ROOT / "dockerfiles/signer/Dockerfile", ROOT),
    "builder": ImageSpec(ROOT / "dockerfiles/builder/Dockerfile", ROOT),
    "tenstorrent-builder": ImageSpec(
        ROOT / "dockerfiles/tenstorrent/builder/Dockerfile",
        ROOT,
        # Debian bookworm has gcc-12 only (its kernels are built with it).
        args={"GCC_PACKAGES": "gcc-12", "TT_SMI_VERSION": "0.0.0-standin"},
        served={
            "TT_SMI_URL": _TT_SMI,
            "TT_KMD_UDEV_URL": Served(
                STAND_INS / "50-tenstorrent.rules", sha256_arg="TT_KMD_UDEV_SHA256"
            ),
        },
    ),
    "tenstorrent-flasher": ImageSpec(
        ROOT / "dockerfiles/tenstorrent/flasher/Dockerfile",
        ROOT / "dockerfiles/tenstorrent/flasher",
        served={
            "TT_SMI_URL": _TT_SMI,
            # A directory is served as a reproducible sdist of it.
            "TT_FLASH_REQUIREMENT": Served(
                STAND_INS / "tt_flash", value="tt-flash @ {url}#sha256={sha256}"
            ),
        },
    ),
}


@dataclass(frozen=True)
class Built:
    """An image in the cache: its oci-archive and the digest of its manifest."""

    archive: Path
    digest: str
    cached: bool  # True when it was already there (no build ran)


# --- pure parts -----------------------------------------------------------------------


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """(KEYWORD, arguments) of a Dockerfile, continuations joined, comments dropped."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        pending = f"{pending} {line}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, args = pending.partition(" ")
        pending = ""
        yield keyword.upper(), args.strip()


def copied_sources(dockerfile_text: str) -> list[str]:
    """What the Dockerfile copies from its build context (COPY/ADD without --from)."""
    sources: list[str] = []
    for keyword, args in _instructions(dockerfile_text):
        if keyword not in ("COPY", "ADD"):
            continue
        words = args.split()
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        rest = " ".join(words)
        paths = json.loads(rest) if rest.startswith("[") else words
        sources += paths[:-1]
    return sources


def ignored(relative: str, patterns: Sequence[str]) -> bool:
    """Whether a context path matches a .dockerignore pattern (``**/`` means any depth)."""
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts):
                return True
        elif fnmatch.fnmatchcase(relative, pattern):
            return True
    return False


def cache_key(
    dockerfile: bytes,
    context_files: Sequence[tuple[str, str]],
    build_args: Mapping[str, str],
    base_digest: str,
) -> str:
    """The digest that names a build's result: equal inputs, equal key."""
    blob = json.dumps(
        {
            "format": FORMAT,
            "dockerfile": hashlib.sha256(dockerfile).hexdigest(),
            "context": sorted(context_files),
            "args": dict(sorted(build_args.items())),
            "base": base_digest,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def base_key(mmdebstrap_version: str) -> str:
    blob = json.dumps(
        [
            FORMAT,
            SUITE,
            "minbase",
            MIRRORS,
            DPKG_OPTIONS,
            APT_CONF,
            BASE_PATH,
            mmdebstrap_version,
        ]
    )
    return hashlib.sha256(blob.encode()).hexdigest()


# --- files and digests ----------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def context_files(context: Path, sources: Sequence[str]) -> list[tuple[str, str]]:
    """(path, sha256 + executable bit) of each file the sources name, as buildah copies them."""
    ignore_file = context / ".dockerignore"
    patterns = [
        line.strip()
        for line in (ignore_file.read_text().splitlines() if ignore_file.exists() else [])
        if line.strip() and not line.startswith("#")
    ]
    out: list[tuple[str, str]] = []
    for source in sources:
        matches = sorted(context.glob(source))
        if not matches:
            raise ImageError(f"{source} is not in the build context {context}")
        for match in matches:
            files = (
                sorted(p for p in match.rglob("*") if p.is_file()) if match.is_dir() else [match]
            )
            for path in files:
                rel = path.relative_to(context).as_posix()
                if not ignored(rel, patterns):
                    mode = "x" if os.access(path, os.X_OK) else "-"
                    out.append((rel, f"{_sha256(path)}{mode}"))
    return out


def archive_digest(archive: Path) -> str:
    """The manifest digest an oci-archive holds (its index's only entry)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return str(index["manifests"][0]["digest"])


def _sdist(source: Path, out_dir: Path) -> Path:
    """A reproducible sdist of a small source tree (fixed names, times and order)."""
    meta = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    stem = f"{meta['name'].replace('-', '_')}-{meta['version']}"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{stem}/{path.relative_to(source).as_posix()}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    out = out_dir / f"{stem}.tar.gz"
    with open(out, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out


# --- processes ------------------------------------------------------------------------


def _stderr_echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run(cmd: Sequence[str], what: str, log: Path | None = None) -> str:
    """Run a command (no shell); on failure raise naming ``what`` with the output's tail."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT, text=True)
        out.seek(0)
        text = out.read()
    if log is not None:
        log.write_text(text)
    if proc.returncode != 0:
        raise ImageError(f"{what} failed ({cmd[0]} exit {proc.returncode}):\n{text[-4000:]}")
    return text


@dataclass(frozen=True)
class Buildah:
    """buildah with a private store (``--root``), so builds never touch the host's images."""

    program: str
    root: Path

    def __call__(self, *args: str, what: str, log: Path | None = None) -> str:
        store = [
            "--root",
            str(self.root / "root"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "overlay",
        ]
        return _run([self.program, *store, *args], what, log)


def _scratch(kind: str, under: Path) -> Path:
    """A scratch directory named for this process, so a later run can tell it is stale."""
    under.mkdir(parents=True, exist_ok=True)
    _sweep(under)
    scratch = Path(tempfile.mkdtemp(prefix=f".{kind}-{os.getpid()}-", dir=under))
    scratch.chmod(0o755)
    return scratch


def _sweep(under: Path) -> None:
    """Remove the scratch directories of runs that died (SIGKILL skips every cleanup)."""
    for path in under.glob(".*-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _discard(path)


def _discard(path: Path) -> None:
    """Unmount what buildah left mounted under ``path`` (deepest first), then remove it."""
    prefix = f"{path}/"
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _store(program: str, under: Path) -> Iterator[Buildah]:
    scratch = _scratch("store", under)
    try:
        yield Buildah(program, scratch)
    finally:
        _discard(scratch)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _into_place(scratch: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    scratch.rename(target)


def images_dir() -> Path:
    return cache_root() / "images"


# --- the base -------------------------------------------------------------------------


def ensure_base(buildah: str = "buildah", echo: Echo = _stderr_echo) -> Built:
    """The minbase Debian image, made with mmdebstrap on first use and cached."""
    version = _run(["mmdebstrap", "--version"], "mmdebstrap --version").strip()
    target = images_dir() / "base" / base_key(version)
    archive = target / "image.tar"
    if archive.is_file():
        return Built(archive, archive_digest(archive), cached=True)
    with _locked(images_dir() / "base.lock"):
        if archive.is_file():
            return Built(archive, archive_digest(archive), cached=True)
        scratch = _scratch("base", target.parent)
        try:
            started = time.monotonic()
            echo(f"images: mmdebstrap {SUITE} minbase from deb.debian.org")
            rootfs = scratch / "rootfs.tar"
            apt_conf = scratch / "apt.conf"
            apt_conf.write_text(APT_CONF)
            _run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--mode=root",
                    "--format=tar",
                    # No device nodes: builds may not mknod (a build Job has no MKNOD), and
                    # every runtime gives a container its own /dev.
                    "--skip=output/dev",
                    *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
                    SUITE,
                    str(rootfs),
                    *MIRRORS,
                ],
                "mmdebstrap",
                scratch / "mmdebstrap.log",
            )
            took = time.monotonic() - started
            with _store(buildah, images_dir()) as b:
                ctr = b("from", "scratch", what="buildah from scratch").strip()
                b("add", ctr, str(rootfs), "/", what="buildah add (the base root)")
                (scratch / "dev").mkdir(mode=0o755)
                b("add", ctr, str(scratch / "dev"), "/dev", what="buildah add (an empty /dev)")
                b(
                    "copy",
                    ctr,
                    str(apt_conf),
                    "/etc/apt/apt.conf.d/90kmodkit-clean",
                    what="buildah copy (apt's configuration)",
                )
                b(
                    "config",
                    "--env",
                    f"PATH={BASE_PATH}",
                    "--cmd",
                    "/bin/bash",
                    "--label",
                    f"org.opencontainers.image.description=Debian {SUITE} minbase (mmdebstrap)",
                    ctr,
                    what="buildah config",
                )
                b("commit", "--rm", ctr, "localhost/kmodkit/base", what="buildah commit")
                b(
                    "push",
                    "localhost/kmodkit/base",
                    f"oci-archive:{scratch / 'image.tar'}",
                    what="buildah push (the base to its archive)",
                )
            rootfs.unlink()
            apt_conf.unlink()
            (scratch / "dev").rmdir()
            (scratch / "timings.json").write_text(
                json.dumps(
                    {
                        "mmdebstrap_seconds": round(took, 1),
                        "total_seconds": round(time.monotonic() - started, 1),
                    }
                )
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        _into_place(scratch, target)
    echo(f"images: base ready in {time.monotonic() - started:.0f}s -> {archive}")
    return Built(archive, archive_digest(archive), cached=False)


# --- stand-ins served for a build -----------------------------------------------------


@dataclass(frozen=True)
class _File:
    path: Path  # what is served
    sha256: str


def _serving_files(served: Mapping[str, Served], out_dir: Path) -> dict[str, _File]:
    files: dict[str, _File] = {}
    for arg, spec in served.items():
        path = _sdist(spec.path, out_dir) if spec.path.is_dir() else spec.path
        files[arg] = _File(path, _sha256(path))
    return files


def _served_args(
    served: Mapping[str, Served], files: Mapping[str, _File], base_url: str
) -> dict[str, str]:
    """The build arguments of served files, for ``base_url`` (``served:`` in the key)."""
    args: dict[str, str] = {}
    for arg, spec in served.items():
        f = files[arg]
        url = f"{base_url}/{f.sha256}/{f.path.name}"
        args[arg] = spec.value.format(url=url, sha256=f.sha256)
        if spec.sha256_arg:
            args[spec.sha256_arg] = f.sha256
    return args


@contextlib.contextmanager
def _serve(files: Mapping[str, _File]) -> Iterator[str]:
    """A loopback HTTP server of ``files`` at /<sha256>/<name>, for one build."""
    by_path = {f"/{f.sha256}/{f.path.name}": f.path for f in files.values()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = by_path.get(self.path.split("#", 1)[0])
            if path is None:
                self.send_error(404)
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- building -------------------------------------------------------------------------


def build_image(
    dockerfile: Path,
    context: Path,
    build_args: Mapping[str, str],
    tag: str,
    *,
    served: Mapping[str, Served] | None = None,
    buildah: str = "buildah",
    ca_bundle: Path | None = HOST_CA,
    echo: Echo = _stderr_echo,
) -> Built:
    """Build ``dockerfile`` (cached by content) into an oci-archive named for ``tag``.

    BASE_IMAGE is the mmdebstrap base unless ``build_args`` names another. RUN steps
    get the host's network and, when ``ca_bundle`` exists, the host's CA bundle at
    BUILD_CA (PIP_CERT) for that step only: the image keeps Debian's trust store.
    """
    served = served or {}
    args = dict(build_args)
    base_digest = ""  # another base is keyed by its name alone
    if "BASE_IMAGE" not in args:
        base = ensure_base(buildah, echo)
        args["BASE_IMAGE"] = f"oci-archive:{base.archive}"
        base_digest = base.digest
    text = dockerfile.read_bytes()
    with tempfile.TemporaryDirectory(prefix="kmodkit-serve-") as tmp:
        files = _serving_files(served, Path(tmp))
        keyed = {**args, **_served_args(served, files, "served:")}
        keyed["BASE_IMAGE"] = build_args.get("BASE_IMAGE", "base")
        key = cache_key(
            text, context_files(context, copied_sources(text.decode())), keyed, base_digest
        )
        target = images_dir() / tag.replace("/", "_") / key
        archive = target / "image.tar"
        if archive.is_file():
            return Built(archive, archive_digest(archive), cached=True)
        with _locked(images_dir() / f"{tag.replace('/', '_')}.lock"):
            if archive.is_file():
                return Built(archive, archive_digest(archive), cached=True)
            return _build(
                dockerfile, context, args, tag, files, served, target, buildah, ca_bundle, echo
            )


def _build(
    dockerfile: Path,
    context: Path,
    args: Mapping[str, str],
    tag: str,
    files: Mapping[str, _File],
    served: Mapping[str, Served],
    target: Path,
    buildah: str,
    ca_bundle: Path | None,
    echo: Echo,
) -> Built:
    scratch = _scratch("build", target.parent)
    started = time.monotonic()
    echo(f"images: building {tag} from {dockerfile}")
    try:
        with _serve(files) as url, _store(buildah, images_dir()) as b:
            all_args = {**args, **_served_args(served, files, url)}
            cmd = [
                "bud",
                "--isolation",
                "chroot",
                "--network",
                "host",
                "-f",
                str(dockerfile),
                "-t",
                f"localhost/{tag}",
            ]
            if ca_bundle is not None and ca_bundle.is_file():
                cmd += ["--volume", f"{ca_bundle}:{BUILD_CA}:ro"]
                all_args.setdefault("PIP_CERT", BUILD_CA)
            for name, value in sorted(all_args.items()):
                cmd += ["--build-arg", f"{name}={value}"]
            b(*cmd, str(context), what=f"building {tag}", log=scratch / "build.log")
            b(
                "push",
                f"localhost/{tag}",
                f"oci-archive:{scratch / 'image.tar'}:{tag}",
                what=f"buildah push ({tag} to its archive)",
            )
        (scratch / "timings.json").write_text(
            json.dumps({"build_seconds": round(time.monotonic() - started, 1)})
        )
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    _into_place(scratch, target)
    archive = target / "image.tar"
    echo(f"images: built {tag} in {time.monotonic() - started:.0f}s -> {archive}")
    return Built(archive, archive_digest(archive), cached=False)


def remove_cached(built: Built) -> None:
    """Drop one result from the cache (tests' throwaway images)."""
    shutil.rmtree(built.archive.parent)


# --- pushing --------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """A registry to push to: TLS verified against ``ca`` (or the system's trust), with
    the logins of a containers auth file (never a password on a command line)."""

    host: str
    ca: Path | None = None
    authfile: Path | None = None


@contextlib.contextmanager
def login_file(host: str, username: str, password: str) -> Iterator[Path]:
    """A containers auth file (0600, removed afterwards) holding one login."""
    import base64

    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    with tempfile.TemporaryDirectory(prefix="kmodkit-auth-") as tmp:
        path = Path(tmp) / "auth.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"auths": {host: {"auth": auth}}}, fh)
        yield path


def push(built: Built, reference: str, dest: Destination) -> str:
    """Copy a cached image to ``reference`` (host/repo:tag); returns host/repo@digest."""
    with tempfile.TemporaryDirectory(prefix="kmodkit-push-") as tmp:
        cmd = ["skopeo", "copy", "--quiet", "--digestfile", f"{tmp}/digest"]
        if dest.ca is not None:
            certs = Path(tmp) / "certs"
            certs.mkdir()
            shutil.copyfile(dest.ca, certs / "ca.crt")
            cmd += ["--dest-cert-dir", str(certs)]
        if dest.authfile is not None:
            cmd += ["--dest-authfile", str(dest.authfile)]
        _run(
            [*cmd, f"oci-archive:{built.archive}", f"docker://{reference}"], f"pushing {reference}"
        )
        digest = (Path(tmp) / "digest").read_text().strip()
    return f"{reference.rsplit(':', 1)[0]}@{digest}"


@functools.cache
def product_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def build_images(
    names: Sequence[str],
    registry: str | Destination,
    *,
    tag: str = "",
    extra_args: Mapping[str, Mapping[str, str]] | None = None,
    buildah: str = "buildah",
    echo: Echo = _stderr_echo,
) -> dict[str, str]:
    """Build (or take from the cache) each named image and push it to
    ``registry``/kmodkit/<name>:<tag>; returns {name: reference with digest}.
    ``extra_args`` adds or overrides build arguments per image."""
    dest = registry if isinstance(registry, Destination) else Destination(registry)
    tag = tag or product_version()
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        raise ImageError(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(IMAGES)}")
    refs: dict[str, str] = {}
    for name in names:
        spec = IMAGES[name]
        args = {**spec.args, **((extra_args or {}).get(name) or {})}
        built = build_image(
            spec.dockerfile,
            spec.context,
            args,
            f"kmodkit/{name}",
            served=spec.served,
            buildah=buildah,
            echo=echo,
        )
        started = time.monotonic()
        refs[name] = push(built, f"{dest.host}/kmodkit/{name}:{tag}", dest)
        echo(
            f"images: pushed {refs[name]} in {time.monotonic() - started:.1f}s"
            f"{' (from the cache)' if built.cached else ''}"
        )
    return refs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kmodkit_dev.images", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "names", nargs="*", help=f"images to build (default: all of {', '.join(IMAGES)})"
    )
    parser.add_argument("--registry", required=True, help="HOST:PORT of the registry")
    parser.add_argument(
        "--ca", type=Path, help="CA certificate the registry's TLS is checked against"
    )
    parser.add_argument(
        "--authfile", type=Path, help="containers auth file with the registry's login"
    )
    parser.add_argument("--tag", default="", help="image tag (default: the product's version)")
    opts = parser.parse_args(argv)
    try:
        refs = build_images(
            opts.names or list(IMAGES),
            Destination(opts.registry, opts.ca, opts.authfile),
            tag=opts.tag,
        )
    except ImageError as e:
        print(e, file=sys.stderr)
        return 1
    for name, ref in refs.items():
        print(f"{name}\t{ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
