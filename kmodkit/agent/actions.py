"""What the agent does on a node: load, unload, report status.

Each public method runs one command end to end and logs every step as a JSON
line. Decisions come from ``plan`` (pure); this module observes, acts through
the kmod layer and the host root, and turns refusals into ``AgentError``s that
carry the exit code.

The load sequence is ordered so that the node is never left worse than it was:
everything that can fail without touching the kernel (host-mode check, build,
image checks) runs before the first module is removed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypeVar

from kmodkit.agent.atomic_file import install_file
from kmodkit.agent.build_cache import ModuleCache
from kmodkit.agent.build_process import BuildRunner, run_streaming
from kmodkit.agent.config import AgentConfig
from kmodkit.agent.errors import AgentError, DeviceBusy, HostManaged, SignatureRejected
from kmodkit.agent.firmware import place_firmware, remove_firmware
from kmodkit.agent.holders import Holder, find_holders
from kmodkit.agent.host_lock import host_lock
from kmodkit.agent.host_mode import HostModeReport, InstallMode, detect_host_mode
from kmodkit.agent.hostroot import HostRoot
from kmodkit.agent.jsonlog import EventLog
from kmodkit.agent.kernel_state import (
    KernelView,
    ModuleObservation,
    Presence,
    bound_devices,
    describe_bound,
    kernel_name,
)
from kmodkit.agent.kmod import CommandResult, CommandRunner, Kmod, KmodError, run_subprocess
from kmodkit.agent.kmsg import KernelLog, open_kmsg
from kmodkit.agent.plan import (
    LoadAction,
    LoadDecision,
    assess_unload,
    decide_load,
    plan_in_tree_removal,
    readiness_problems,
)
from kmodkit.agent.signature import (
    ModuleSignature,
    may_be_refusal,
    module_of,
    refusal_message,
    refused_file,
    signature_refusal,
)

Killer = Callable[[int, int], None]
_P = ParamSpec("_P")
_T = TypeVar("_T")

# How long a finished modprobe may take to report "live" (async probing).
_VERIFY_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class HostAccess:
    """How the agent reaches the node; tests swap in a simulated kernel."""

    kmod_runner: CommandRunner = run_subprocess
    build_runner: BuildRunner = run_streaming
    kill: Killer = os.kill
    poll_interval: float = 0.25
    pause_poll_interval: float = 5.0
    lock_timeout: float = 300.0
    kernel_log: Callable[[], KernelLog] = open_kmsg


def report_host_mode(host: HostRoot, dkms_modules: list[str], log: EventLog) -> HostModeReport:
    report = detect_host_mode(host, dkms_modules)
    log.info(
        "host_mode.detected",
        install_mode=str(report.mode),
        signals=[{"kind": s.kind, "path": s.path} for s in report.signals],
        dkms_modules=dkms_modules,
    )
    return report


class NodeAgent:
    def __init__(
        self, config: AgentConfig, host: HostRoot, log: EventLog, access: HostAccess
    ) -> None:
        self.config = config
        self.host = host
        self.log = log
        self.access = access
        self.kernel = config.kernel_version or host.kernel_release()
        self.kmod = Kmod(access.kmod_runner)
        self.view = KernelView(host, self.kernel)
        self.top = config.modprobe.module_name
        self.replaces_in_tree = frozenset(config.loading_order) & frozenset(
            config.in_tree_modules_to_remove
        )
        self._expected: dict[str, str] | None = None

    # -- commands ---------------------------------------------------------

    def load(self) -> None:
        self._require_container_mode()
        if self.paused() and self._decide()[3].action is not LoadAction.NOTHING:
            self.log.info("load.paused", message="the policy is paused; loading waits for it")
            while self.paused():
                time.sleep(self.access.pause_poll_interval)
            self.log.info("load.unpaused")
            self._require_container_mode()  # DKMS may have come back meanwhile
        with self._lock():
            self._load_locked()

    def paused(self) -> bool:
        """Whether the pause file says ``true`` (no file: not paused)."""
        if self.config.pause_file is None:
            return False
        try:
            return Path(self.config.pause_file).read_text().strip().lower() == "true"
        except OSError:
            return False

    def _decide(
        self,
    ) -> tuple[ModuleSource | None, Mapping[str, str], dict[str, ModuleObservation], LoadDecision]:
        # The image's modules are what this agent must have loaded: checked
        # first, so a loaded build that is not theirs is never taken as ready.
        image = None if self.config.build is not None else self._check_image()
        expected = image.srcversions if image is not None else {}
        order = self.config.loading_order
        observed = self.view.observe(order)
        decision = decide_load(
            order, observed, self.config.version, self.replaces_in_tree, expected
        )
        return image, expected, observed, decision

    def _load_locked(self) -> None:
        image, expected, observed, decision = self._decide()
        order = self.config.loading_order
        self.log.info(
            "load.decision",
            action=str(decision.action),
            reasons=list(decision.reasons),
            kernel=self.kernel,
            version=self.config.version,
            modules=list(order),
        )
        if decision.action is LoadAction.BLOCKED:
            raise AgentError(
                f"cannot load {self.top}: {'; '.join(decision.reasons)}; "
                "a built-in module cannot be replaced by a loadable one",
                reasons=list(decision.reasons),
            )
        # Before the load: udev gives the device nodes their mode only as it creates
        # them, so a rule installed after insmod would leave them root-only.
        self._install_host_files()
        if decision.action is not LoadAction.NOTHING:
            self._load_modules(observed, decision.unload_first, image, expected)
        self._log_ready()

    def unload(self, *, force: bool) -> None:
        self._require_container_mode()
        with self._serving(shared=False), self._lock():
            self._unload_modules(self.config.unloading_order, force=force, purpose="unload")
            firmware_dir = self.config.modprobe.firmware_path
            if firmware_dir is not None and Path(firmware_dir).is_dir():
                removed = remove_firmware(
                    self.host, Path(firmware_dir), self.config.firmware_host_path
                )
                self.log.info("firmware.removed", files=removed)
            self.log.info("unload.done", modules=list(self.config.unloading_order))

    def serving(self) -> AbstractContextManager[None]:
        """Held while a loader keeps the driver loaded (see kmodkit.agent.host_lock)."""
        return self._serving(shared=True)

    def reload_if_gone(self) -> bool:
        """Load again when the driver vanished under a running loader (a manual rmmod, a
        crash); a module that is there, whatever its state, is the status's to report.

        Decided under the lock: a successor swapping the module (its old build out, its
        new one in) holds it throughout, so a predecessor still running never takes the
        gap for a vanished driver, and never replaces whatever is loaded."""
        if self.view.observe((self.top,))[self.top].presence is not Presence.ABSENT:
            return False
        self._require_container_mode()
        with self._lock():
            if self.view.observe((self.top,))[self.top].presence is not Presence.ABSENT:
                return False
            self.log.warning("module.disappeared", module=self.top)
            self._load_locked()
        return True

    def status(self) -> list[str]:
        """Problems keeping the driver from being ready, read from the live kernel."""
        order = self.config.loading_order
        observed = self.view.observe(order)
        for name in order:
            self.log.info("module.observed", **_observation_log(observed[name]))
        problems = self._problems(observed)
        self.log.info(
            "status",
            ready=not problems,
            problems=problems,
            kernel=self.kernel,
            expected_version=self.config.version,
        )
        return problems

    def readiness(self) -> list[str]:
        """What ``status`` says, without logging it: the serving loop asks every 10 s."""
        return self._problems(self.view.observe(self.config.loading_order))

    def _problems(self, observed: dict[str, ModuleObservation]) -> list[str]:
        return readiness_problems(
            self.config.loading_order,
            observed,
            self.config.version,
            self.replaces_in_tree,
            self._expected_builds(),
        )

    # -- load steps -------------------------------------------------------

    def _load_modules(
        self,
        observed: dict[str, ModuleObservation],
        unload_first: tuple[str, ...],
        image: ModuleSource | None,
        expected: Mapping[str, str],
    ) -> None:
        source = image or self._build()
        previous = observed[self.top].version if unload_first else None
        if unload_first:
            self._unload_modules(unload_first, force=self.config.force_unload, purpose="replace")
        self._remove_in_tree_modules()
        self._place_firmware()
        try:
            self._insert(source)
            self._verify(expected)
        except AgentError as failure:
            self._roll_back(previous, failure)
            raise

    def _build(self) -> ModuleSource:
        """Make the new modules ready on disk; failing here leaves the kernel untouched."""
        build = self.config.build
        assert build is not None  # images are checked before anything is decided
        version = self.config.version
        assert version is not None  # guaranteed by AgentConfig validation
        cache = ModuleCache(self.host, build.cache_dir)
        where = self.host.host_view(cache.version_dir(self.kernel, version))
        if cache.has(self.kernel, version, self.config.loading_order):
            self.log.info("build.cache_hit", kernel=self.kernel, version=version, path=where)
        else:
            self.log.info("build.started", kernel=self.kernel, version=version, path=where)
            tail = cache.build(
                kernel=self.kernel,
                version=version,
                modules=self.config.loading_order,
                command=build.command,
                run=self.access.build_runner,
                timeout=build.timeout_seconds,
                on_line=lambda line: self.log.info("build.output", line=line),
            )
            self.log.info("build.done", kernel=self.kernel, version=version, output_tail=tail)
        return ModuleSource(cache=cache, version=version)

    def _check_image(self) -> ModuleSource:
        base = self.config.modprobe.dir_name
        modules_dir = Path(base) / "lib" / "modules" / self.kernel
        if not modules_dir.is_dir():
            raise AgentError(
                f"the image has no modules for kernel {self.kernel}: {modules_dir} does not "
                "exist; build or pick an image for this kernel",
                kernel=self.kernel,
                path=str(modules_dir),
            )
        if not (modules_dir / "modules.dep").is_file():
            # modprobe resolves dependencies from modules.dep; images often ship without it.
            result = self._kmod(self.kmod.depmod, base, self.kernel)
            self.log.info("image.depmod", argv=list(result.argv))
        versions = {name: self._modinfo(name, "version") for name in self.config.loading_order}
        srcversions = self._image_srcversions()
        self.log.info(
            "image.checked", path=str(modules_dir), versions=versions, srcversions=srcversions
        )
        expected = self.config.version
        if expected is not None and versions[self.top] != expected:
            raise AgentError(
                f"the image carries {self.top} version {versions[self.top] or 'unset'}, "
                f"expected {expected}; the loaded driver was left in place",
                found=versions[self.top],
                expected=expected,
            )
        return ModuleSource(cache=None, version=expected, srcversions=srcversions)

    def _modinfo(self, name: str, field: str) -> str:
        return self._kmod(
            self.kmod.modinfo_field,
            name,
            field,
            base_dir=self.config.modprobe.dir_name,
            kernel=self.kernel,
        )

    def _image_srcversions(self) -> dict[str, str]:
        """The srcversion of each module the image carries (none when it has none)."""
        found = {name: self._modinfo(name, "srcversion") for name in self.config.loading_order}
        return {name: value for name, value in found.items() if value}

    def _expected_builds(self) -> dict[str, str]:
        """What a status check compares the loaded modules with: the image's builds.

        Read once: the pod's copy of the image never changes, and a modinfo per
        module on every check is most of what a check costs."""
        if self.config.build is not None:
            return {}
        if self._expected is None:
            base = Path(self.config.modprobe.dir_name) / "lib" / "modules" / self.kernel
            # No modules.dep yet: the load's depmod has not run (nothing to compare).
            if not (base / "modules.dep").is_file():
                return {}
            self._expected = self._image_srcversions()
        return self._expected

    def _remove_in_tree_modules(self) -> None:
        names = self.config.in_tree_modules_to_remove
        if not names:
            return
        observed = self.view.observe(names)
        removal = plan_in_tree_removal(names, observed)
        for name in removal.builtin:
            self.log.warning(
                "in_tree.builtin",
                module=name,
                message=f"{name} is built into the kernel and cannot be removed; left as is",
            )
        for name in removal.absent:
            self.log.info("in_tree.absent", module=name)
        if removal.remove:
            self._unload_modules(removal.remove, force=self.config.force_unload, purpose="in_tree")

    def _place_firmware(self) -> None:
        firmware_dir = self.config.modprobe.firmware_path
        if firmware_dir is None:
            return
        image_dir = Path(firmware_dir)
        if not image_dir.is_dir():
            raise AgentError(
                f"modprobe.firmwarePath {firmware_dir} does not exist in the image",
                path=firmware_dir,
            )
        placed = place_firmware(self.host, image_dir, self.config.firmware_host_path, self.kernel)
        self.log.info(
            "firmware.placed",
            host_dir=self.config.firmware_host_path,
            installed=list(placed.installed),
            unchanged=list(placed.unchanged),
        )
        if placed.class_path_set:
            self.log.info(
                "firmware.class_path_set",
                path=self.config.firmware_host_path,
                previous=placed.class_path_before,
            )
            if placed.class_path_before:
                self.log.warning(
                    "firmware.class_path_replaced",
                    message="firmware_class.path held another directory; drivers that "
                    "relied on it will not find their firmware there any more",
                    previous=placed.class_path_before,
                )
        elif placed.class_path_needed and placed.class_path_before is None:
            self.log.warning(
                "firmware.class_path_unavailable",
                message=f"the kernel does not search {self.config.firmware_host_path} and "
                "has no firmware_class.path parameter; set firmwareHostPath to /lib/firmware",
            )

    def _insert(self, source: ModuleSource) -> None:
        observed = self.view.observe(self.config.loading_order)
        raw = self.config.modprobe.raw_args
        if raw is not None and source.cache is None:
            # The Module's own command line loads what it loads; what the agent
            # verifies afterwards is moduleName, as for any other Module.
            result = self._inserting(self.top, None, self.kmod.modprobe_raw, raw.load)
            self.log.info("module.loaded_raw", module=self.top, argv=list(result.argv))
            return
        for name in self.config.loading_order:
            if observed[name].presence is Presence.LOADED:
                self.log.info("module.already_loaded", module=name)
                continue
            parameters = self.config.modprobe.parameters if name == self.top else []
            if source.cache is not None:
                path = source.cache.module_path(self.kernel, source.version or "", name)
                result = self._inserting(name, str(path), self.kmod.insmod, path, parameters)
            else:
                result = self._inserting(
                    name,
                    None,
                    self.kmod.modprobe,
                    name,
                    dir_name=self.config.modprobe.dir_name,
                    args=self.config.modprobe.args.load,
                    parameters=parameters,
                )
            self.log.info("module.loaded", module=name, argv=list(result.argv))

    def _inserting(
        self,
        name: str,
        file: str | None,
        call: Callable[_P, CommandResult],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> CommandResult:
        """Run one insert; a failure the kernel gave for the module's signature becomes
        ``SignatureRejected``, naming what modinfo reads from the refused file."""
        kernel_log = self.access.kernel_log()
        try:
            return call(*args, **kwargs)
        except KmodError as exc:
            said = kernel_log.new_lines()
            result = exc.result
            output = f"{result.stderr}\n{result.stdout}"
            if not may_be_refusal(output, said):
                raise AgentError(str(exc), argv=list(result.argv)) from exc
            # modprobe inserts the dependencies first: the refused file may be one of them.
            refused = file or refused_file(result.stdout)
            module = module_of(refused) if refused else name
            signature = self._signature(refused, module)
            refusal = signature_refusal(output, said, signature)
            if refusal is None:
                raise AgentError(str(exc), argv=list(result.argv)) from exc
            raise SignatureRejected(
                refusal_message(module, refused, refusal, signature),
                argv=list(result.argv),
                module=module,
                file=refused,
                errno=refusal.errno,
                signed=signature.signed,
                signer=signature.signer,
                sig_key=signature.sig_key,
                sig_hashalgo=signature.hash_algo,
                kernel_messages=list(refusal.kernel_lines),
            ) from exc
        finally:
            kernel_log.close()

    def _signature(self, file: str | None, name: str) -> ModuleSignature:
        """What modinfo reads from the refused file's signature (by name in the image
        when the file is not known); empty when modinfo cannot tell."""

        def field(wanted: str) -> str:
            try:
                if file is not None:
                    return self.kmod.modinfo_file(file, wanted)
                return self.kmod.modinfo_field(
                    name, wanted, base_dir=self.config.modprobe.dir_name, kernel=self.kernel
                )
            except KmodError:
                return ""

        return ModuleSignature(
            signer=field("signer"),
            sig_key=field("sig_key"),
            hash_algo=field("sig_hashalgo"),
            sig_id=field("sig_id"),
        )

    def _verify(self, expected: Mapping[str, str]) -> None:
        order = self.config.loading_order
        deadline = time.monotonic() + _VERIFY_TIMEOUT_SECONDS
        while True:
            observed = self.view.observe(order)
            problems = readiness_problems(
                order, observed, self.config.version, self.replaces_in_tree, expected
            )
            if not problems or time.monotonic() >= deadline:
                break
            time.sleep(self.access.poll_interval)
        if problems:
            raise AgentError(
                f"{self.top} did not come up: {'; '.join(problems)}", problems=problems
            )

    def _roll_back(self, previous: str | None, failure: AgentError) -> None:
        """Put the previous build back after a failed swap, when its cache entry exists."""
        build = self.config.build
        if build is None or previous is None or previous == self.config.version:
            return
        cache = ModuleCache(self.host, build.cache_dir)
        if not cache.has(self.kernel, previous, self.config.loading_order):
            self.log.warning("rollback.unavailable", version=previous, reason="not in cache")
            return
        self.log.warning("rollback.started", version=previous, cause=failure.message)
        try:
            self._unload_modules(self.config.unloading_order, force=False, purpose="rollback")
            self._insert(ModuleSource(cache=cache, version=previous))
        except AgentError as again:
            self.log.error("rollback.failed", version=previous, message=again.message)
            return
        failure.fields["rolled_back_to"] = previous
        self.log.warning("rollback.done", version=previous)

    def _install_host_files(self) -> None:
        for entry in self.config.host_files:
            changed = install_file(Path(entry.source), self.host.path(entry.target), entry.mode)
            self.log.info(
                "host_file.installed" if changed else "host_file.unchanged",
                source=entry.source,
                target=entry.target,
                mode=f"{entry.mode:04o}",
            )

    def _log_ready(self) -> None:
        observed = self.view.observe(self.config.loading_order)
        self.log.info(
            "ready",
            kernel=self.kernel,
            version=observed[self.top].version,
            modules=[_observation_log(observed[n]) for n in self.config.loading_order],
        )

    # -- unload -----------------------------------------------------------

    def _unload_modules(self, order: tuple[str, ...], *, force: bool, purpose: str) -> None:
        """Remove ``order``'s loaded modules, first to last, after freeing or refusing."""
        assessment = assess_unload(order, self.view.observe(order))
        if not assessment.loaded:
            self.log.info("unload.nothing_loaded", modules=list(order), purpose=purpose)
            return
        if assessment.foreign_users:
            users = {m: list(u) for m, u in assessment.foreign_users.items()}
            raise DeviceBusy(
                "refusing to unload: "
                + "; ".join(f"{m} is used by module(s) {', '.join(u)}" for m, u in users.items())
                + " which this agent does not manage; unload those first",
                purpose=purpose,
                module_users=users,
            )
        if assessment.process_refs:
            self._free_devices(order, dict(assessment.process_refs), force=force, purpose=purpose)
        raw = self.config.modprobe.raw_args
        if purpose == "unload" and raw is not None:
            result = self._kmod(self.kmod.modprobe_raw, raw.unload)
            self.log.info(
                "modules.removed_raw", modules=list(assessment.loaded), argv=list(result.argv)
            )
            return
        unload_args = self.config.modprobe.args.unload
        if purpose == "unload" and unload_args:
            # As KMM: modprobe -r with the Module's arguments, which also removes the
            # dependencies modprobe pulled in that nothing else uses.
            result = self._kmod(
                self.kmod.modprobe_remove,
                assessment.loaded,
                dir_name=self.config.modprobe.dir_name,
                args=unload_args,
            )
            self.log.info(
                "modules.removed", modules=list(assessment.loaded), argv=list(result.argv)
            )
            return
        for name in assessment.loaded:
            try:
                result = self._kmod(self.kmod.rmmod, name)
            except AgentError as failure:
                refs = assess_unload((name,), self.view.observe((name,))).process_refs
                if refs:
                    raise DeviceBusy(
                        f"{name} was opened again while unloading; {failure.message}",
                        purpose=purpose,
                        refcnt=refs,
                    ) from failure
                raise
            self.log.info("module.removed", module=name, purpose=purpose, argv=list(result.argv))

    def _free_devices(
        self, order: tuple[str, ...], refs: dict[str, int], *, force: bool, purpose: str
    ) -> None:
        holders = find_holders(self.host, self.config.device_paths)
        details = {
            "purpose": purpose,
            "refcnt": refs,
            "holders": [h.as_log() for h in holders],
            "device_paths": self.config.device_paths,
        }
        if not force:
            bound = [d for name in refs for d in bound_devices(self.host, name)]
            raise DeviceBusy(
                f"refusing to unload: {_describe_refs(refs)} held by {_describe(holders)}"
                f"{describe_bound(bound)}; drain the workloads using the device, or enable "
                "forceUnload",
                **details,
                bound_devices=[":".join(d) for d in bound],
            )
        if not holders:
            raise DeviceBusy(
                f"cannot force-unload: {_describe_refs(refs)} but no process holds "
                f"{', '.join(self.config.device_paths) or 'a configured device path'}; "
                "the loader pod needs hostPID and devicePaths to see the holders",
                **details,
            )
        for holder in holders:
            self.log.warning("holder.killed", purpose=purpose, **holder.as_log())
            try:
                self.access.kill(holder.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # it exited on its own meanwhile
        deadline = time.monotonic() + self.config.unload_timeout_seconds
        while True:
            remaining = assess_unload(order, self.view.observe(order)).process_refs
            if not remaining:
                return
            if time.monotonic() >= deadline:
                still = find_holders(self.host, self.config.device_paths)
                raise DeviceBusy(
                    f"still busy {self.config.unload_timeout_seconds:g}s after killing "
                    f"{_describe(holders)}: {_describe_refs(remaining)}, held by "
                    f"{_describe(still)}",
                    purpose=purpose,
                    refcnt=remaining,
                    holders=[h.as_log() for h in still],
                )
            time.sleep(self.access.poll_interval)

    # -- helpers ----------------------------------------------------------

    def _require_container_mode(self) -> None:
        report = report_host_mode(self.host, self.config.dkms_names, self.log)
        if report.mode is InstallMode.HOST:
            raise HostManaged(
                "the driver is managed by DKMS on this host; the agent leaves it alone. "
                "Remove the DKMS signals to hand it over",
                signals=[s.path for s in report.signals],
            )

    def _lock(self) -> AbstractContextManager[None]:
        return host_lock(self.host, kernel_name(self.top), self.access.lock_timeout)

    def _serving(self, *, shared: bool) -> AbstractContextManager[None]:
        return host_lock(
            self.host,
            kernel_name(self.top),
            self.access.lock_timeout,
            suffix="serving",
            shared=shared,
        )

    @staticmethod
    def _kmod(call: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return call(*args, **kwargs)
        except KmodError as exc:
            raise AgentError(str(exc), argv=list(exc.result.argv)) from exc


@dataclass(frozen=True)
class ModuleSource:
    """Where the new modules come from: the build cache, or the image via modprobe."""

    cache: ModuleCache | None
    version: str | None
    srcversions: Mapping[str, str] = field(default_factory=dict)
    """What the kernel reports for each module once these are loaded (from modinfo)."""


def _observation_log(seen: ModuleObservation) -> dict[str, object]:
    return {
        "module": seen.name,
        "presence": str(seen.presence),
        "initstate": seen.initstate,
        "refcnt": seen.refcnt,
        "version": seen.version,
        "srcversion": seen.srcversion,
        "used_by": list(seen.used_by),
    }


def _describe_refs(refs: dict[str, int]) -> str:
    return ", ".join(f"{m} has {n} open reference(s)" for m, n in refs.items())


def _describe(holders: list[Holder]) -> str:
    if not holders:
        return "no visible process"
    return ", ".join(f"pid {h.pid} ({h.comm}) on {', '.join(h.devices)}" for h in holders)
