"""A small simulated kernel behind the kmod commands, for node-agent tests.

It answers ``insmod``, ``rmmod``, ``modprobe`` (and ``-r``), ``depmod`` and ``modinfo`` the
way Linux and kmod do, and keeps a host root's ``/proc/modules``,
``/sys/module/<m>/{initstate,refcnt,version,taint,parameters}`` and
``/proc/<pid>/fd`` in step, so the agent reads its state exactly as on a node.
The rules it enforces are the kernel's: a module loads only after the modules
it uses; a module in use (by another module or an open device) cannot be
removed; a driver whose firmware is missing fails its init; SIGKILL frees the
files a process held.

A ``.ko`` here is a JSON document (see ``write_module``), not an ELF object.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kmodkit.agent.kmod import CommandResult

FIRMWARE_SEARCH = ("/lib/firmware/updates", "/lib/firmware")


def kname(name: str) -> str:
    return name.replace("-", "_")


def write_module(
    path: Path,
    name: str,
    *,
    version: str | None = None,
    srcversion: str | None = None,
    depends: Sequence[str] = (),
    devices: Sequence[str] = (),
    firmware: Sequence[str] = (),
    in_tree: bool = False,
    signer: str | None = None,
    sig_key: str | None = None,
) -> Path:
    """Write a fake module: what the simulated kernel needs to know to load it.
    ``signer``/``sig_key``: the signature modinfo reads (none: unsigned)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "name": kname(name),
                "version": version,
                "srcversion": srcversion,
                "depends": [kname(d) for d in depends],
                "devices": list(devices),
                "firmware": list(firmware),
                "in_tree": in_tree,
                "signer": signer,
                "sig_key": sig_key,
                "sig_hashalgo": "sha256" if sig_key else None,
                "sig_id": "PKCS#7" if sig_key else None,
            }
        )
    )
    return path


@dataclass
class _Module:
    name: str
    version: str | None
    srcversion: str | None
    depends: list[str]
    devices: list[str]
    out_of_tree: bool
    parameters: dict[str, str]
    # References held by open files (and anything else that is not a module).
    refs: int = 0


@dataclass
class _Process:
    pid: int
    devices: list[str]
    unkillable: bool


@dataclass
class SimulatedKernel:
    host: Path
    release: str = "6.1.0-sim-amd64"
    builtin: Sequence[str] = ()
    calls: list[tuple[str, ...]] = field(default_factory=list)
    kills: list[tuple[int, int]] = field(default_factory=list)
    modules: dict[str, _Module] = field(default_factory=dict)
    processes: dict[int, _Process] = field(default_factory=dict)
    sig_enforce: bool = False
    """As ``module.sig_enforce=1``: only modules signed with a trusted key load."""
    trusted_keys: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)
    """What the kernel printed (its ring buffer), for ``kernel_log``."""

    def __post_init__(self) -> None:
        self._write(Path("/proc/sys/kernel/osrelease"), self.release + "\n")
        builtin_list = "".join(f"kernel/drivers/sim/{b}.ko\n" for b in self.builtin)
        self._write(Path(f"/lib/modules/{self.release}/modules.builtin"), builtin_list)
        for name in self.builtin:
            # Built-in modules with parameters appear in sysfs, without initstate.
            self._path(f"/sys/module/{kname(name)}/parameters").mkdir(parents=True, exist_ok=True)
        self._write(Path("/sys/module/firmware_class/parameters/path"), "\n")
        self._publish()

    # -- the world outside the kmod commands ------------------------------

    def open_device(
        self,
        pid: int,
        comm: str,
        device: str,
        *,
        cmdline: Sequence[str] = (),
        unkillable: bool = False,
    ) -> None:
        """A process opens a device node; the module providing it gains a reference."""
        owner = next((m for m in self.modules.values() if device in m.devices), None)
        if owner is None:
            raise ValueError(f"no loaded module provides {device}")
        owner.refs += 1
        process = self.processes.setdefault(pid, _Process(pid, [], unkillable))
        process.devices.append(device)
        self._make_proc_entry(pid, comm, cmdline or (comm,), process.devices)
        self._publish()

    def spawn(self, pid: int, comm: str, open_files: Sequence[str]) -> None:
        """A process that holds files no module cares about."""
        self._make_proc_entry(pid, comm, (comm,), list(open_files))

    def bind_device(self, module: str, bus: str, address: str) -> None:
        """A device bound to ``module``'s driver, as sysfs shows it (the driver is named as
        the module is)."""
        driver = self._path(f"/sys/bus/{bus}/drivers/{module}")
        driver.mkdir(parents=True, exist_ok=True)
        for attribute in ("bind", "unbind", "uevent"):
            (driver / attribute).touch()
        device = self._path(f"/sys/devices/{bus}0000:00/{address}")
        device.mkdir(parents=True, exist_ok=True)
        (driver / address).symlink_to(device)
        link = self._path(f"/sys/module/{kname(module)}/drivers/{bus}:{module}")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(driver)

    def hold_invisibly(self, module: str) -> None:
        """A reference from outside this PID namespace: no /proc entry to find."""
        self.modules[kname(module)].refs += 1
        self._publish()

    def kill(self, pid: int, signum: int) -> None:
        if not self._path(f"/proc/{pid}").exists():
            raise ProcessLookupError(pid)
        self.kills.append((pid, signum))
        process = self.processes.get(pid)
        if process is not None and process.unkillable:
            return  # stuck in uninterruptible sleep: the signal stays pending
        shutil.rmtree(self._path(f"/proc/{pid}"))
        if process is not None:
            del self.processes[pid]
            for device in process.devices:
                for module in self.modules.values():
                    if device in module.devices:
                        module.refs -= 1
        self._publish()

    def reboot(self) -> SimulatedKernel:
        """A fresh boot on the same disk: nothing loaded, no processes."""
        shutil.rmtree(self._path("/proc"))
        shutil.rmtree(self._path("/sys"))
        return SimulatedKernel(self.host, self.release, self.builtin)

    def kernel_log(self) -> _KernelLog:
        """What the agent reads from /dev/kmsg: the messages printed from now on."""
        return _KernelLog(self, len(self.messages))

    def firmware_class_path(self) -> str:
        parameter = self._path("/sys/module/firmware_class/parameters/path")
        return parameter.read_text().strip() if parameter.exists() else ""

    # -- the kmod commands ------------------------------------------------

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args)
        tool = os.path.basename(args[0])
        handlers = {
            "insmod": self._insmod,
            "rmmod": self._rmmod,
            "modprobe": self._modprobe,
            "depmod": self._depmod,
            "modinfo": self._modinfo,
        }
        if tool not in handlers:
            return CommandResult(args, 127, "", f"{tool}: not a kmod command")
        try:
            out = handlers[tool](list(args[1:]))
        except _Fail as failure:
            return CommandResult(args, 1, failure.stdout, f"{tool}: ERROR: {failure}\n")
        return CommandResult(args, 0, out, "")

    def _insmod(self, args: list[str]) -> str:
        path, *parameters = args
        self._insert(Path(path), parameters)
        return ""

    def _rmmod(self, args: list[str]) -> str:
        if any(a.startswith("-") for a in args):
            raise _Fail("the simulation refuses rmmod options: forced removal corrupts a kernel")
        (target,) = args
        name = kname(Path(target).name.removesuffix(".ko"))
        if name in self.builtin:
            raise _Fail(f"Module {name} is builtin.")
        module = self.modules.get(name)
        if module is None:
            raise _Fail(f"Module {name} is not currently loaded")
        users = self._users(name)
        if users:
            raise _Fail(f"Module {name} is in use by: {' '.join(users)}")
        if module.refs:
            raise _Fail(f"Module {name} is in use")
        del self.modules[name]
        shutil.rmtree(self._path(f"/sys/module/{name}"))
        self._publish()
        return ""

    def _modprobe(self, args: list[str]) -> str:
        base: str | None = None
        words: list[str] = []
        remove = False
        rest = iter(args)
        for arg in rest:
            if arg == "-d":
                base = next(rest)
            elif arg == "-r":
                remove = True
            elif arg.startswith("-") and not arg.startswith("--") and "f" in arg:
                raise _Fail("the simulation refuses forced removal: it corrupts a kernel")
            elif not arg.startswith("-"):
                words.append(arg)
        if base is None:
            raise _Fail("the simulation needs modprobe -d <dir>")
        if remove:
            for name in words:
                self._remove_with_dependencies(kname(name))
            return "".join(f"rmmod {w}\n" for w in words)
        name, *parameters = words
        name = kname(name)
        if name in self.modules or name in self.builtin:
            return ""
        modules_dir = Path(base) / "lib" / "modules" / self.release
        dep = self._read_dep(modules_dir)
        if name not in dep:
            raise _Fail(f"FATAL: Module {name} not found in directory {modules_dir}")
        relpath, deps = dep[name]
        # As modprobe -v: each insert is printed before it is tried, so what was printed
        # when one fails ends with the file that failed.
        printed: list[str] = []
        inserts: list[tuple[str, list[str]]] = [
            (d, []) for d in reversed(deps) if kname(Path(d).stem) not in self.modules
        ]
        for file, params in [*inserts, (relpath, parameters)]:
            printed.append(f"insmod {modules_dir / file} {' '.join(params)}".strip() + "\n")
            try:
                self._insert(modules_dir / file, params)
            except _Fail as failure:
                failure.stdout = "".join(printed)
                raise
        return "".join(printed)

    def _remove_with_dependencies(self, name: str) -> None:
        """modprobe -r: remove ``name``, then each dependency nothing else uses any more."""
        module = self.modules.get(name)
        if module is None:
            raise _Fail(f"FATAL: Module {name} is not in kernel.")
        if self._users(name) or module.refs:
            raise _Fail(f"FATAL: Module {name} is in use.")
        self._rmmod([name])
        for dependency in module.depends:
            held = dependency not in self.modules or self._users(dependency)
            if not held and not self.modules[dependency].refs:
                self._remove_with_dependencies(dependency)

    def _depmod(self, args: list[str]) -> str:
        base = args[args.index("-b") + 1]
        release = args[-1]
        modules_dir = Path(base) / "lib" / "modules" / release
        found = {_read_ko(p)["name"]: p.relative_to(modules_dir) for p in modules_dir.rglob("*.ko")}
        lines = []
        for relpath in sorted(found.values()):
            closure: list[str] = []
            queue = list(_read_ko(modules_dir / relpath)["depends"])
            while queue:
                dependency = queue.pop(0)
                if dependency in closure or dependency not in found:
                    continue
                closure.append(dependency)
                queue.extend(_read_ko(modules_dir / found[dependency])["depends"])
            lines.append(f"{relpath}: {' '.join(str(found[d]) for d in closure)}".rstrip())
        (modules_dir / "modules.dep").write_text("\n".join(lines) + "\n")
        return ""

    def _modinfo(self, args: list[str]) -> str:
        wanted = args[args.index("-F") + 1]
        if "-b" not in args:  # a file named by its path
            value = _read_ko(Path(args[-1])).get(wanted)
            return "" if value is None else f"{value}\n"
        base = args[args.index("-b") + 1]
        release = args[args.index("-k") + 1]
        wanted = args[args.index("-F") + 1]
        module = args[-1]
        modules_dir = Path(base) / "lib" / "modules" / release
        dep = self._read_dep(modules_dir)
        if kname(module) not in dep:
            raise _Fail(f"Module {module} not found.")
        info = _read_ko(modules_dir / dep[kname(module)][0])
        value = info.get(wanted)
        return "" if value is None else f"{value}\n"

    # -- kernel internals -------------------------------------------------

    def _insert(self, path: Path, parameters: list[str]) -> None:
        try:
            info = _read_ko(path)
        except FileNotFoundError:
            raise _Fail(f"could not load module {path}: No such file or directory") from None
        name = info["name"]
        if name in self.modules or name in self.builtin:
            raise _Fail(f"could not insert module {path}: File exists")
        if self.sig_enforce and info.get("sig_key") not in self.trusted_keys:
            what = "unsigned module" if not info.get("sig_key") else "module with unavailable key"
            self.messages.append(f"Loading of {what} is rejected")
            raise _Fail(f"could not insert module {path}: Key was rejected by service")
        missing = [d for d in info["depends"] if d not in self.modules]
        if missing:
            raise _Fail(
                f"could not insert module {path}: Unknown symbol in module "
                f"(needs {', '.join(missing)})"
            )
        absent_firmware = [f for f in info["firmware"] if not self._firmware_exists(f)]
        if absent_firmware:
            # request_firmware() failed during probe, so init returned -ENOENT.
            raise _Fail(f"could not insert module {path}: No such file or directory")
        self.modules[name] = _Module(
            name=name,
            version=info["version"],
            srcversion=info.get("srcversion"),
            depends=list(info["depends"]),
            devices=list(info["devices"]),
            out_of_tree=not info["in_tree"],
            parameters=dict(p.split("=", 1) for p in parameters),
        )
        self._publish()

    def _firmware_exists(self, relative: str) -> bool:
        custom = self.firmware_class_path()
        search = [*FIRMWARE_SEARCH, *([custom] if custom else [])]
        return any(self._path(f"{directory}/{relative}").is_file() for directory in search)

    def _users(self, name: str) -> list[str]:
        return [m.name for m in self.modules.values() if name in m.depends]

    def _publish(self) -> None:
        """Rewrite /proc/modules and /sys/module/<m> from the kernel's state."""
        lines = []
        for module in self.modules.values():
            users = self._users(module.name)
            refcnt = len(users) + module.refs
            taint = " (OE)" if module.out_of_tree else ""
            used_by = "".join(f"{u}," for u in users) or "-"
            lines.append(f"{module.name} 16384 {refcnt} {used_by} Live 0x0000000000000000{taint}")
            sysdir = f"/sys/module/{module.name}"
            self._write(Path(f"{sysdir}/initstate"), "live\n")
            self._write(Path(f"{sysdir}/refcnt"), f"{refcnt}\n")
            self._write(Path(f"{sysdir}/taint"), "OE\n" if module.out_of_tree else "\n")
            if module.version is not None:
                self._write(Path(f"{sysdir}/version"), module.version + "\n")
            if module.srcversion is not None:
                self._write(Path(f"{sysdir}/srcversion"), module.srcversion + "\n")
            for key, value in module.parameters.items():
                self._write(Path(f"{sysdir}/parameters/{key}"), value + "\n")
        self._write(Path("/proc/modules"), "".join(line + "\n" for line in lines))

    def _make_proc_entry(
        self, pid: int, comm: str, cmdline: Sequence[str], open_files: list[str]
    ) -> None:
        proc = self._path(f"/proc/{pid}")
        (proc / "fd").mkdir(parents=True, exist_ok=True)
        (proc / "comm").write_text(comm + "\n")
        (proc / "cmdline").write_text("\0".join(cmdline) + "\0")
        for fd in (proc / "fd").iterdir():
            fd.unlink()
        for number, target in enumerate(open_files, start=3):
            os.symlink(target, proc / "fd" / str(number))

    def _read_dep(self, modules_dir: Path) -> dict[str, tuple[str, list[str]]]:
        dep_file = modules_dir / "modules.dep"
        if not dep_file.is_file():
            raise _Fail(f"FATAL: could not open {dep_file}: No such file or directory")
        entries: dict[str, tuple[str, list[str]]] = {}
        for line in dep_file.read_text().splitlines():
            relpath, _, deps = line.partition(":")
            entries[kname(Path(relpath).stem)] = (relpath, deps.split())
        return entries

    def _path(self, host_path: str) -> Path:
        return self.host / host_path.lstrip("/")

    def _write(self, host_path: Path, text: str) -> None:
        target = self._path(str(host_path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


class _Fail(Exception):
    stdout = ""


@dataclass
class _KernelLog:
    kernel: SimulatedKernel
    seen: int

    def new_lines(self) -> list[str]:
        lines = self.kernel.messages[self.seen :]
        self.seen = len(self.kernel.messages)
        return lines

    def close(self) -> None:
        pass


def _read_ko(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
