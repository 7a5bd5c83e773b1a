"""Runs inside the kernel-tier VM: the real agent against a real Linux kernel.

Started by the VM's /init (tests/kernel/vm_init.sh) with this machine's Python,
chrooted into this machine's root. Each check prints one line
``KMODKIT-CHECK {"name": ..., "ok": ..., "detail": ...}`` on the console; the
pytest side (test_real_kernel.py) boots the VM and asserts on those lines.
Standard library only, plus the agent's own command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(os.environ["KMODKIT_REPO"])
DRIVER = Path(os.environ["KMODKIT_DRIVER"])
WORK = Path("/run/kmodkit-test")  # the only writable place (tmpfs) in the chroot
NODE = WORK / "node"  # the VM's initramfs root: the kernel's view of "/"
IMAGE = WORK / "image"
FIRMWARE = WORK / "image-firmware"
CONFIG = WORK / "agent.json"
TOP, DEP = "kmodkit_test_dev", "kmodkit_test_dep"
DEVICE = "/dev/kmodkit_test"
FIRMWARE_BYTES = os.urandom(5000)


def agent(*args: str, config: Path = CONFIG) -> tuple[int, list[dict[str, Any]]]:
    command = [sys.executable, "-c", "from kmodkit.agent.cli import main; main()"]
    done = subprocess.run(
        [*command, "--host-root", str(NODE), "--config", str(config), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    records = []
    for line in done.stdout.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"event": "unparsable", "line": line})
    if done.stderr.strip():
        records.append({"event": "stderr", "text": done.stderr[-2000:]})
    return done.returncode, records


def events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == name]


def loaded() -> list[str]:
    return [line.split()[0] for line in Path("/proc/modules").read_text().splitlines()]


def sysfs(module: str, name: str) -> str:
    return Path(f"/sys/module/{module}/{name}").read_text().strip()


def report(name: str, ok: bool, detail: object = None) -> None:
    line = json.dumps({"name": name, "ok": bool(ok), "detail": detail}, default=str)
    print(f"KMODKIT-CHECK {line}", flush=True)


def check(name: str, body: Callable[[], tuple[bool, object]]) -> None:
    started = time.monotonic()
    try:
        ok, detail = body()
    except Exception:
        ok, detail = False, traceback.format_exc()
    report(name, ok, {"seconds": round(time.monotonic() - started, 1), "detail": detail})


def set_up() -> None:
    shutil.copytree(DRIVER / "opt", IMAGE / "opt")
    (FIRMWARE / "kmodkit-test").mkdir(parents=True)
    (FIRMWARE / "kmodkit-test" / "fw.bin").write_bytes(FIRMWARE_BYTES)
    CONFIG.write_text(
        json.dumps(
            {
                "modprobe": {
                    "moduleName": TOP,
                    "dirName": str(IMAGE / "opt"),
                    "modulesLoadingOrder": [TOP, DEP],
                    "firmwarePath": str(FIRMWARE),
                },
                "version": "1.2.3",
                "devicePaths": [DEVICE],
                "firmwareHostPath": "/var/lib/firmware",
                "unloadTimeoutSeconds": 20,
            }
        )
    )


def the_pair_must_load_in_order() -> tuple[bool, object]:
    ko = IMAGE / "opt/lib/modules" / os.uname().release / "extra" / f"{TOP}.ko"
    done = subprocess.run(["insmod", str(ko)], capture_output=True, text=True, check=False)
    return done.returncode != 0 and TOP not in loaded(), done.stderr.strip()


def detect_container() -> tuple[bool, object]:
    code, records = agent("detect")
    return code == 0, records


def status_before_load() -> tuple[bool, object]:
    code, records = agent("status")
    return code == 5, events(records, "status")


def load() -> tuple[bool, object]:
    code, records = agent("load")
    order = [e["module"] for e in events(records, "module.loaded")]
    facts = {
        "exit": code,
        "order": order,
        "loaded": loaded(),
        "initstate": sysfs(TOP, "initstate"),
        "version": sysfs(TOP, "version"),
        "dep_refcnt": sysfs(DEP, "refcnt"),
        "depmod": bool(events(records, "image.depmod")),
    }
    ok = bool(
        code == 0
        and order == [DEP, TOP]
        and facts["initstate"] == "live"
        and facts["version"] == "1.2.3"
        and facts["dep_refcnt"] == "1"
        and facts["depmod"]
    )
    return ok, (facts if ok else {**facts, "records": records})


def firmware_placed_before_load() -> tuple[bool, object]:
    size = sysfs(TOP, "parameters/firmware_size")
    class_path = Path("/sys/module/firmware_class/parameters/path").read_text().strip()
    placed = (NODE / "var/lib/firmware/kmodkit-test/fw.bin").read_bytes() == FIRMWARE_BYTES
    ok = size == str(len(FIRMWARE_BYTES)) and class_path == "/var/lib/firmware" and placed
    return ok, {"firmware_size": size, "class_path": class_path, "placed": placed}


def load_again_does_nothing() -> tuple[bool, object]:
    code, records = agent("load")
    decision = events(records, "load.decision")
    ok = code == 0 and decision[0]["action"] == "nothing" and not events(records, "module.loaded")
    return ok, decision


def status_ready() -> tuple[bool, object]:
    code, records = agent("status")
    return code == 0, events(records, "status")


def held_device(body: Callable[[subprocess.Popen[bytes]], tuple[bool, object]]) -> Any:
    def run() -> tuple[bool, object]:
        with open(DEVICE, "rb") as device:
            holder = subprocess.Popen(["sleep", "600"], stdin=device)
        try:
            deadline = time.monotonic() + 10
            while sysfs(TOP, "refcnt") != "1" and time.monotonic() < deadline:
                time.sleep(0.1)
            return body(holder)
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.wait()

    return run


def unload_refused_naming_the_holder(holder: subprocess.Popen[bytes]) -> tuple[bool, object]:
    busy = subprocess.run(["rmmod", TOP], capture_output=True, text=True, check=False)
    code, records = agent("unload")
    refused = events(records, "unload.refused")
    holders = refused[0]["holders"] if refused else []
    ok = (
        busy.returncode != 0
        and code == 3
        and [(h["pid"], h["comm"], h["devices"]) for h in holders]
        == [(holder.pid, "sleep", [DEVICE])]
        and TOP in loaded()
        and holder.poll() is None
    )
    return ok, {"rmmod": busy.stderr.strip(), "exit": code, "refused": refused}


def force_unload_kills_the_holder(holder: subprocess.Popen[bytes]) -> tuple[bool, object]:
    code, records = agent("unload", "--force-unload")
    killed = [e["pid"] for e in events(records, "holder.killed")]
    returncode = holder.wait(timeout=20)
    removed = [e["module"] for e in events(records, "module.removed")]
    firmware_gone = not (NODE / "var/lib/firmware/kmodkit-test/fw.bin").exists()
    ok = (
        code == 0
        and killed == [holder.pid]
        and returncode == -9
        and removed == [TOP, DEP]
        and TOP not in loaded()
        and DEP not in loaded()
        and firmware_gone
    )
    facts = {"exit": code, "killed": killed, "holder_exit": returncode, "removed": removed}
    return ok, (facts if ok else {**facts, "records": records})


def dkms_state_signal() -> tuple[bool, object]:
    state = NODE / "var/lib/dkms" / TOP
    state.mkdir(parents=True)
    try:
        detect_code, detected = agent("detect")
        load_code, _ = agent("load")
        ok = detect_code == 4 and load_code == 4 and TOP not in loaded()
        return ok, events(detected, "host_mode.detected")
    finally:
        state.rmdir()


def dkms_source_signal() -> tuple[bool, object]:
    conf = NODE / "usr/src" / f"{TOP}-1.2.3" / "dkms.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'PACKAGE_NAME="{TOP}"\n')
    try:
        code, detected = agent("detect")
    finally:
        shutil.rmtree(conf.parent)
    after, _ = agent("detect")
    return code == 4 and after == 0, events(detected, "host_mode.detected")


def main() -> None:
    set_up()
    check("pair_loads_only_in_order", the_pair_must_load_in_order)
    check("detect_container", detect_container)
    check("status_before_load", status_before_load)
    check("load", load)
    check("firmware_placed_before_load", firmware_placed_before_load)
    check("load_again_does_nothing", load_again_does_nothing)
    check("status_ready", status_ready)
    check("unload_refused_naming_the_holder", held_device(unload_refused_naming_the_holder))
    check("force_unload_kills_the_holder", held_device(force_unload_kills_the_holder))
    check("dkms_state_signal", dkms_state_signal)
    check("dkms_source_signal", dkms_source_signal)
    print("KMODKIT-DONE", flush=True)


if __name__ == "__main__":
    main()
