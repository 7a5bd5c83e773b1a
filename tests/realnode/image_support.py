"""Reading back the images kmodkit_dev.images pushed, and running them without an engine.

An image is pulled from the registry with skopeo into an OCI layout, its layers are
applied in order onto a directory (whiteouts honoured) and its entrypoint is run there
under chroot as the image's user: the same files and argv a container would run,
without namespaces or cgroups.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmodkit_dev import images


def counting_buildah(workdir: Path) -> tuple[str, Path]:
    """A wrapper that logs each call on a line of the returned file, then runs buildah."""
    real = shutil.which("buildah")
    assert real, "buildah is not installed"
    calls = workdir / "buildah-calls"
    calls.touch()
    wrapper = workdir / "buildah"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >>"{calls}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), calls


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


@dataclass(frozen=True)
class Pulled:
    digest: str  # of the manifest, as the registry serves it
    config: dict[str, Any]  # the image config's "config" (Entrypoint, User, Env, ...)
    rootfs: Path


def _skopeo_flags(dest: images.Destination) -> list[str]:
    flags = []
    if dest.ca is not None:
        certs = dest.ca.parent / "skopeo-certs"
        certs.mkdir(exist_ok=True)
        shutil.copyfile(dest.ca, certs / "ca.crt")
        flags += ["--src-cert-dir", str(certs)]
    if dest.authfile is not None:
        flags += ["--src-authfile", str(dest.authfile)]
    return flags


def pull(reference: str, dest: images.Destination, workdir: Path) -> Pulled:
    """Pull ``reference`` (host/repo@digest) and unpack it under ``workdir``."""
    layout = workdir / "layout"
    subprocess.run(
        ["skopeo", "copy", "--quiet", *_skopeo_flags(dest), f"docker://{reference}",
         f"oci:{layout}:image"],
        check=True,
    )  # fmt: skip
    index = json.loads((layout / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    manifest = json.loads(_blob(layout, digest).read_text())
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
    rootfs = workdir / "rootfs"
    rootfs.mkdir()
    for layer in manifest["layers"]:
        _apply(_blob(layout, layer["digest"]), rootfs)
    return Pulled(digest, config.get("config") or {}, rootfs)


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _apply(layer: Path, rootfs: Path) -> None:
    """One layer onto ``rootfs``: whiteouts delete, then the rest is extracted."""
    with tarfile.open(layer) as tar:
        members = tar.getmembers()
        for m in members:
            name = os.path.basename(m.name)
            parent = rootfs / os.path.dirname(m.name)
            if name == ".wh..wh..opq":
                for child in parent.iterdir() if parent.is_dir() else []:
                    _remove(child)
            elif name.startswith(".wh."):
                _remove(parent / name[len(".wh.") :])
        kept = [m for m in members if not os.path.basename(m.name).startswith(".wh.")]
        for m in kept:
            target = rootfs / m.name
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
        # The layers are ours, from our registry; device nodes are never in them.
        tar.extractall(rootfs, members=kept, filter="fully_trusted")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def run(
    pulled: Pulled,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (default: the image's entrypoint and cmd) in the image's root, as its user."""
    dev_null = pulled.rootfs / "dev" / "null"
    if not dev_null.exists():
        dev_null.parent.mkdir(exist_ok=True)
        os.mknod(dev_null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (pulled.rootfs / "tmp").mkdir(exist_ok=True)
    (pulled.rootfs / "tmp").chmod(0o1777)
    command = list(argv) if argv is not None else [
        *(pulled.config.get("Entrypoint") or []), *(pulled.config.get("Cmd") or []),
    ]  # fmt: skip
    image_env = dict(e.split("=", 1) for e in pulled.config.get("Env") or [])
    user = pulled.config.get("User") or "0:0"
    if ":" not in user:
        user = f"{user}:{user}"
    return subprocess.run(
        ["chroot", f"--userspec={user}", str(pulled.rootfs),
         "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in {**image_env, **(env or {})}.items()),
         *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )  # fmt: skip
