"""Modules built on the node, cached per kernel and driver version.

Layout: ``<cacheDir>/<kernel>/<version>/<module>.ko``. A version directory
appears only by an atomic rename of a finished build, so its presence means a
complete build: a crash mid-build leaves a ``.build-*`` directory that is
ignored and swept on the next build.

Building happens before anything is unloaded. A failed build costs nothing: the
driver already loaded stays loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kmodkit.agent.build_process import TIMED_OUT, BuildRunner
from kmodkit.agent.errors import AgentError
from kmodkit.agent.hostroot import HostRoot
from kmodkit.agent.kernel_state import kernel_name

_OUTPUT_TAIL_LINES = 40


class BuildFailed(AgentError):
    event = "build.failed"


@dataclass(frozen=True)
class ModuleCache:
    host: HostRoot
    cache_dir: str

    def version_dir(self, kernel: str, version: str) -> Path:
        return self.host.path(self.cache_dir) / kernel / version

    def module_path(self, kernel: str, version: str, module: str) -> Path:
        return self.version_dir(kernel, version) / f"{kernel_name(module)}.ko"

    def has(self, kernel: str, version: str, modules: tuple[str, ...]) -> bool:
        return all(self.module_path(kernel, version, m).is_file() for m in modules)

    def build(
        self,
        *,
        kernel: str,
        version: str,
        modules: tuple[str, ...],
        command: list[str],
        run: BuildRunner,
        timeout: float,
        on_line: Callable[[str], None],
    ) -> list[str]:
        """Run the build command (each output line to ``on_line`` as it comes) and
        publish what it built; returns the output tail."""
        headers = self.host.path(f"/lib/modules/{kernel}/build")
        if not (headers / "Makefile").is_file():
            raise BuildFailed(
                f"kernel headers for {kernel} are missing on the node "
                f"(no {self.host.host_view(headers)}/Makefile): install linux-headers-{kernel}",
                kernel=kernel,
            )
        kernel_dir = self.host.path(self.cache_dir) / kernel
        kernel_dir.mkdir(parents=True, exist_ok=True)
        _sweep_abandoned_builds(kernel_dir)
        staging = Path(tempfile.mkdtemp(dir=kernel_dir, prefix=f".build-{version}-"))
        try:
            result = run(
                command,
                env=_build_env(kernel, version, staging, headers),
                cwd=staging,
                timeout=timeout,
                on_line=on_line,
            )
            tail = _tail(result.stdout)
            if result.returncode == TIMED_OUT:
                raise BuildFailed(
                    f"build of version {version} for kernel {kernel} did not finish in "
                    f"{timeout:g}s (build.timeoutSeconds) and was stopped; the loaded driver "
                    "was left in place. A clone that hangs is often a missing proxy setting",
                    kernel=kernel,
                    version=version,
                    output_tail=tail,
                )
            if result.returncode != 0:
                raise BuildFailed(
                    f"build of version {version} for kernel {kernel} exited "
                    f"{result.returncode}; the loaded driver was left in place",
                    kernel=kernel,
                    version=version,
                    output_tail=tail,
                )
            missing = [
                f"{kernel_name(m)}.ko"
                for m in modules
                if not (staging / f"{kernel_name(m)}.ko").is_file()
            ]
            if missing:
                raise BuildFailed(
                    f"build succeeded but did not produce {', '.join(missing)} in "
                    "$KMODKIT_OUTPUT_DIR; the loaded driver was left in place",
                    kernel=kernel,
                    version=version,
                    output_tail=tail,
                )
            _publish(staging, self.version_dir(kernel, version))
            return tail
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _build_env(kernel: str, version: str, output: Path, headers: Path) -> Mapping[str, str]:
    return {
        **os.environ,
        "KMODKIT_KERNEL_VERSION": kernel,
        "KMODKIT_VERSION": version,
        "KMODKIT_OUTPUT_DIR": str(output),
        "KMODKIT_KERNEL_BUILD_DIR": str(headers),
    }


def _publish(staging: Path, final: Path) -> None:
    for artifact in staging.rglob("*"):
        if artifact.is_file():
            with artifact.open("rb") as handle:
                os.fsync(handle.fileno())
    try:
        os.rename(staging, final)
    except OSError:
        # Another agent published the same version first; its build is as good.
        if not final.is_dir():
            raise


def _sweep_abandoned_builds(kernel_dir: Path) -> None:
    for leftover in kernel_dir.glob(".build-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _tail(output: str) -> list[str]:
    return output.splitlines()[-_OUTPUT_TAIL_LINES:]
