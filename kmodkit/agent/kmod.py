"""The kmod command layer: modprobe, insmod, rmmod, depmod and modinfo.

Commands run through an injectable ``CommandRunner`` so tests can answer them
with a simulated kernel; production uses ``run_subprocess``. The layer builds
argument vectors and turns a non-zero exit into ``KmodError``; it makes no
decisions.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float | None = None,
    ) -> CommandResult: ...


def run_subprocess(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> CommandResult:
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found ({exc})")
    except subprocess.TimeoutExpired as exc:
        return CommandResult(tuple(argv), 124, _text(exc.stdout), f"timed out after {timeout}s")
    return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)


def _text(output: str | bytes | None) -> str:
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


class KmodError(Exception):
    def __init__(self, result: CommandResult) -> None:
        self.result = result
        detail = result.stderr.strip() or result.stdout.strip() or "no output"
        super().__init__(f"{' '.join(result.argv)} exited {result.returncode}: {detail}")


class Kmod:
    def __init__(self, run: CommandRunner) -> None:
        self._run = run

    def modprobe(
        self, name: str, *, dir_name: str, args: Sequence[str], parameters: Sequence[str]
    ) -> CommandResult:
        return self._check(["modprobe", "-v", "-d", dir_name, *args, name, *parameters])

    def modprobe_remove(
        self, names: Sequence[str], *, dir_name: str, args: Sequence[str]
    ) -> CommandResult:
        """``modprobe -r``: the modules, then the dependencies modprobe pulled in that
        nothing else uses. ``args`` never carry a force flag (the config refuses it)."""
        return self._check(["modprobe", "-r", "-v", "-d", dir_name, *args, *names])

    def modprobe_raw(self, args: Sequence[str]) -> CommandResult:
        """modprobe with a Module's own argument list (KMM's rawArgs), as arguments: no shell."""
        return self._check(["modprobe", *args])

    def insmod(self, path: Path, parameters: Sequence[str]) -> CommandResult:
        return self._check(["insmod", str(path), *parameters])

    def rmmod(self, name: str) -> CommandResult:
        # Deliberately no way to pass -f: forcing removal of a module in use
        # corrupts the kernel; a busy module is refused and reported instead.
        return self._check(["rmmod", name])

    def depmod(self, base_dir: str, kernel: str) -> CommandResult:
        return self._check(["depmod", "-b", base_dir, kernel])

    def modinfo_field(self, module: str, field: str, *, base_dir: str, kernel: str) -> str:
        result = self._check(["modinfo", "-b", base_dir, "-k", kernel, "-F", field, module])
        return result.stdout.strip()

    def modinfo_file(self, path: str, field: str) -> str:
        """A field of one ``.ko`` file, read from the file itself (no module directory)."""
        return self._check(["modinfo", "-F", field, path]).stdout.strip()

    def _check(self, argv: list[str]) -> CommandResult:
        result = self._run(argv)
        if result.returncode != 0:
            raise KmodError(result)
        return result
