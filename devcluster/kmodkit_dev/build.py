"""Build devcluster's binaries from the Go module proxy (or take them from a pinned
Debian package), cached per tool and version.

The cache lives outside the repository (``$KMODKIT_CACHE`` or
``$XDG_CACHE_HOME/kmodkit``), keyed by tool and version, so only the first use
on a machine pays for the build. A build writes into a scratch directory and
renames it into place, so an interrupted build never leaves a half-filled cache.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kmodkit_dev.versions import TOOLS, Tool

GOMOD_DIR = Path(__file__).parent / "gomod"
Echo = Callable[[str], None]


class BuildError(RuntimeError):
    """A tool could not be built; the message names the tool and Go's own words."""


def _stderr_echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("KMODKIT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kmodkit"


def bin_dir(tool: Tool) -> Path:
    return cache_root() / "bin" / f"{tool.name}-{tool.version}"


def binary(name: str) -> Path:
    """Path of one executable (``kube-apiserver``, ``helm``, …) in the cache."""
    for tool in TOOLS.values():
        if name in tool.binaries:
            return bin_dir(tool) / name
    raise KeyError(f"no devcluster tool provides {name!r}")


def is_built(tool: Tool) -> bool:
    names = [*tool.binaries, *(Path(path).name for _, path in tool.files)]
    return all((bin_dir(tool) / n).is_file() for n in names)


def tool_file(tool_name: str, name: str) -> Path:
    """A file a tool's build copied out of its source (see ``Tool.files``)."""
    return bin_dir(TOOLS[tool_name]) / name


def ensure(names: Iterable[str], echo: Echo = _stderr_echo) -> None:
    """Build every named tool that is not cached yet."""
    for name in names:
        tool = TOOLS[name]
        if is_built(tool):
            continue
        root = cache_root()
        root.mkdir(parents=True, exist_ok=True)
        # Two processes (a test run and the demo) may start at once: the
        # second waits for the first and then finds the cache filled.
        with open(root / f"{tool.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_built(tool):
                _build(tool, echo)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",
        # A go line newer than the installed toolchain must fail loudly rather
        # than silently download another toolchain.
        GOTOOLCHAIN="local",
        GOFLAGS="-mod=readonly -buildvcs=false",
    )
    return env


def _build(tool: Tool, echo: Echo) -> None:
    target = bin_dir(tool)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{tool.name}-", dir=target.parent))
    scratch.chmod(0o755)
    started = time.monotonic()
    try:
        (_unpack_deb if tool.deb else _go_build)(tool, scratch, echo)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    scratch.rename(target)
    echo(
        f"devcluster: built {tool.name} {tool.version} in "
        f"{int(time.monotonic() - started)}s -> {target}"
    )


def _go_build(tool: Tool, scratch: Path, echo: Echo) -> None:
    if shutil.which("go") is None:
        raise BuildError(f"cannot build {tool.name}: the Go toolchain (go) is not on PATH")
    # One invocation for all of a tool's packages shares their compile work;
    # a single package gets an explicit name (etcd's main package path ends in /v3).
    out = f"{scratch}/" if len(tool.packages) > 1 else str(scratch / tool.binaries[0])
    cmd = [
        "go",
        "build",
        "-trimpath",
        "-pgo=off",
        "-ldflags",
        tool.ldflags,
        "-o",
        out,
        *tool.packages,
    ]
    echo(
        f"devcluster: building {tool.name} {tool.version} from the Go module proxy "
        "(first use on this machine; cached afterwards)"
    )
    started = time.monotonic()
    log = scratch / "build.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=GOMOD_DIR / tool.name, env=_go_env(), stdout=fh, stderr=subprocess.STDOUT
        )
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                echo(
                    f"devcluster:   still building {tool.name} "
                    f"({int(time.monotonic() - started)}s so far)"
                )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise BuildError(
            f"building {tool.name} {tool.version} failed (go build exit {proc.returncode}):\n{tail}"
        )
    log.unlink()
    for module, path in tool.files:
        source = subprocess.run(
            ["go", "list", "-m", "-f", "{{.Dir}}", module],
            cwd=GOMOD_DIR / tool.name,
            env=_go_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        shutil.copyfile(Path(source) / path, scratch / Path(path).name)


def _unpack_deb(tool: Tool, scratch: Path, echo: Echo) -> None:
    """The binaries out of the pinned Debian package, fetched but never installed
    (no maintainer scripts, no service)."""
    for command in ("apt-get", "dpkg-deb"):
        if shutil.which(command) is None:
            raise BuildError(f"cannot fetch {tool.name}: {command} is not on PATH (Debian's)")
    echo(f"devcluster: fetching {tool.name} {tool.version} from Debian's {tool.deb} package")
    fetched = subprocess.run(
        ["apt-get", "download", f"{tool.deb}={tool.version}"],
        cwd=scratch,
        capture_output=True,
        text=True,
    )
    if fetched.returncode != 0:
        raise BuildError(
            f"fetching {tool.deb} {tool.version} failed: {fetched.stderr.strip()}\n"
            "run apt-get update; if Debian has replaced that version, update the pin in "
            "kmodkit_dev/versions.py"
        )
    (deb,) = scratch.glob("*.deb")
    root = scratch / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    for name in tool.binaries:
        (root / "usr" / "bin" / name).rename(scratch / name)
    shutil.rmtree(root)
    deb.unlink()


if __name__ == "__main__":
    try:
        ensure(sys.argv[1:] or TOOLS)
    except BuildError as e:
        sys.exit(str(e))
