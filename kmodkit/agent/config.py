"""The agent's configuration: one YAML or JSON document per loader pod.

``modprobe`` has the shape of KMM's ``moduleLoader.container.modprobe`` so the
operator can pass a Module's loader settings through unchanged; the other keys
are the node-side facts KMM keeps implicit (which devices a driver exposes,
where firmware goes, how to build on the node).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from kmodkit.agent.errors import ConfigError


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ModprobeArgs(_Model):
    load: list[str] = Field(default_factory=list)
    unload: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _never_forced(self) -> Self:
        # Forcing the removal of a module in use corrupts the kernel.
        forced = [a for a in self.unload if forces_removal(a)]
        if forced:
            raise ValueError(
                f"unload arguments must not force a removal ({', '.join(forced)}); "
                "a module in use is refused and reported instead"
            )
        return self


def forces_removal(arg: str) -> bool:
    """Whether a modprobe argument forces the removal of a module (-f, -rf, --force...)."""
    if arg.startswith("--"):
        return arg.startswith("--force")
    return arg.startswith("-") and "f" in arg[1:]


class ModprobeConfig(_Model):
    module_name: str = Field(min_length=1)
    """What is verified loaded; with raw_args, the module raw_args.load loads."""
    # KMM's layout: modules live under <dirName>/lib/modules/<kernel>/.
    dir_name: str = "/opt"
    parameters: list[str] = Field(default_factory=list)
    args: ModprobeArgs = Field(default_factory=ModprobeArgs)
    firmware_path: str | None = None
    modules_loading_order: list[str] | None = None
    raw_args: ModprobeArgs | None = None
    """KMM's rawArgs: the whole modprobe argument lists, run instead of the agent's own."""

    @model_validator(mode="after")
    def _order_is_kmm_valid(self) -> Self:
        order = self.modules_loading_order
        if order is None:
            return self
        if len(order) < 2:
            raise ValueError("modprobe.modulesLoadingOrder needs at least 2 entries")
        if order[0] != self.module_name:
            raise ValueError(
                "modprobe.modulesLoadingOrder must start with modprobe.moduleName "
                f"({self.module_name!r}), got {order[0]!r}"
            )
        if len(set(order)) != len(order):
            raise ValueError("modprobe.modulesLoadingOrder has duplicate entries")
        return self


class BuildConfig(_Model):
    """Build the modules on the node instead of taking them from an image."""

    command: list[str] = Field(min_length=1)
    cache_dir: str
    timeout_seconds: float = Field(default=1800, gt=0)


class HostFile(_Model):
    source: str
    target: str
    mode: int = 0o755

    @model_validator(mode="before")
    @classmethod
    def _octal_mode(cls, data: object) -> object:
        # "0755" in YAML is a string; 0o755 would be an int. Accept both.
        if isinstance(data, dict) and isinstance(data.get("mode"), str):
            return {**data, "mode": int(data["mode"], 8)}
        return data


class AgentConfig(_Model):
    modprobe: ModprobeConfig
    # The top module's MODULE_VERSION, compared with /sys/module/<name>/version;
    # also the build cache key. Omit to accept whatever version is loaded.
    version: str | None = None
    kernel_version: str | None = None
    in_tree_modules_to_remove: list[str] = Field(default_factory=list)
    firmware_host_path: str = "/var/lib/firmware"
    device_paths: list[str] = Field(default_factory=list)
    force_unload: bool = False
    unload_timeout_seconds: float = Field(default=10, ge=0)
    # None means "the module name"; an empty list turns host-mode detection off.
    dkms_modules: list[str] | None = None
    build: BuildConfig | None = None
    host_files: list[HostFile] = Field(default_factory=list)
    unload_on_terminate: bool = False
    # A file (in the container) whose content "true" holds the agent back from changing
    # the kernel by itself: a paused policy's pods keep what is loaded.
    pause_file: str | None = None

    @model_validator(mode="after")
    def _build_needs_version(self) -> Self:
        if self.build is not None and not self.version:
            raise ValueError("build needs version: the cache is keyed by kernel and version")
        return self

    @property
    def loading_order(self) -> tuple[str, ...]:
        """Dependencies first. KMM lists the top module first, so loading reverses it."""
        order = self.modprobe.modules_loading_order
        return tuple(reversed(order)) if order else (self.modprobe.module_name,)

    @property
    def unloading_order(self) -> tuple[str, ...]:
        return tuple(reversed(self.loading_order))

    @property
    def dkms_names(self) -> list[str]:
        if self.dkms_modules is None:
            return [self.modprobe.module_name]
        return self.dkms_modules


def load_config(path: Path) -> AgentConfig:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}", path=str(path)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML/JSON: {exc}", path=str(path)) from exc
    return parse_config(document, source=str(path))


def parse_config(document: object, *, source: str) -> AgentConfig:
    try:
        return AgentConfig.model_validate(document)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError(
            f"config {source} is invalid: {'; '.join(problems)}", path=source, problems=problems
        ) from exc
