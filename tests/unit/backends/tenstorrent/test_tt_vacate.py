"""The DKMS vacate procedure, run for real with chroot on a host root made in a temp dir.

The host's kmod and DKMS tools are shell-function fakes acting on that root (rmmod
removes /sys/module/tenstorrent, modprobe -n finds .ko files), so the script's
own logic runs unchanged: refuse while held, vacate, verify, and repeat safely.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kmodkit.backends.tenstorrent.vacate import EXIT_HELD, REPORT, SCRIPT, VACATED, vacate_pod

KVER = "6.8.0-45-generic"
FAKES = {
    "uname": f"echo {KVER}",
    "rmmod": 'rm -rf "/sys/module/$1"; echo "rmmod $*" >> /actions',
    "depmod": 'echo "depmod $*" >> /actions',
    "dkms": 'echo "dkms $*" >> /actions',
    "modprobe": f'[ -n "$(find /lib/modules/{KVER} -name "$2.ko*")" ]',
}

# The vacate script runs for real under chroot with busybox: root and busybox
# (installed by `make test`'s system-deps) are required, never skipped.


def _host(tmp_path: Path, loaded: bool = True, dkms: bool = True, holder: bool = False) -> Path:
    root = tmp_path / "host"
    (root / "bin").mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy(busybox, root / "bin" / "busybox")
    for tool in ("sh", "cat", "readlink", "find", "ls", "rm", "echo", "["):
        (root / "bin" / tool).symlink_to("busybox")
    modules = root / "lib" / "modules" / KVER
    (modules / "updates" / "dkms").mkdir(parents=True)
    if loaded:
        module = root / "sys" / "module" / "tenstorrent"
        module.mkdir(parents=True)
        (module / "refcnt").write_text("1\n" if holder else "0\n")
        (module / "version").write_text("2.8.0\n")
    if dkms:
        (root / "var" / "lib" / "dkms" / "tenstorrent" / "2.8.0").mkdir(parents=True)
        (root / "usr" / "src" / "tenstorrent-2.8.0").mkdir(parents=True)
        (root / "usr" / "src" / "tenstorrent-2.8.0" / "dkms.conf").write_text("")
        (modules / "updates" / "dkms" / "tenstorrent.ko.zst").write_text("")
    (root / "dev" / "tenstorrent").mkdir(parents=True)
    (root / "proc" / "4242" / "fd").mkdir(parents=True)
    (root / "proc" / "4242" / "comm").write_text("tt-smi\n")
    if holder:
        (root / "proc" / "4242" / "fd" / "3").symlink_to("/dev/tenstorrent/0")
    return root


def _run(root: Path, **fakes: str) -> subprocess.CompletedProcess[str]:
    # Shell functions win over busybox's built-in applets, so the fakes stand in for the
    # host's tools while the script itself runs unchanged.
    tools = "\n".join(f"{name}() {{ {body}; }}" for name, body in {**FAKES, **fakes}.items())
    return subprocess.run(
        [shutil.which("chroot") or "chroot", str(root), "/bin/sh", "-c", tools + "\n" + SCRIPT],
        capture_output=True,
        text=True,
        env={"PATH": "/bin"},
        check=False,
    )


def test_vacates_a_dkms_host_and_says_what_it_did(tmp_path: Path) -> None:
    root = _host(tmp_path)
    run = _run(root)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "found: tenstorrent loaded, version 2.8.0, refcnt 0" in out
    assert "did: rmmod tenstorrent" in out
    assert "did: rm -rf /var/lib/dkms/tenstorrent" in out
    assert "did: rm -rf /usr/src/tenstorrent-2.8.0" in out
    assert f"did: rm /lib/modules/{KVER}/updates/dkms/tenstorrent.ko.zst" in out
    assert f"did: depmod -a {KVER}" in out
    assert out.rstrip().endswith(VACATED)
    assert not (root / "var" / "lib" / "dkms" / "tenstorrent").exists()
    assert "dkms remove tenstorrent --all" in (root / "actions").read_text()

    again = _run(root)
    assert again.returncode == 0
    assert "did:" not in again.stdout, "a clean host is left alone"
    assert again.stdout.rstrip().endswith(VACATED)


def test_refuses_while_the_device_is_held_and_changes_nothing(tmp_path: Path) -> None:
    root = _host(tmp_path, holder=True)
    run = _run(root)
    assert run.returncode == 3
    assert "found: pid 4242 (tt-smi) holds /dev/tenstorrent/0" in run.stdout
    assert "refused: /dev/tenstorrent is in use" in run.stdout
    assert (root / "sys" / "module" / "tenstorrent").exists()
    assert (root / "var" / "lib" / "dkms" / "tenstorrent").exists()
    assert not (root / "actions").exists()


def test_the_holder_scan_reads_every_fd_without_a_process_per_fd(tmp_path: Path) -> None:
    # A busy node has hundreds of thousands of open fds: a readlink per fd would
    # fork that many processes. The scan runs one find and one ls for all of them.
    root = _host(tmp_path, holder=True)
    for pid in range(5000, 5040):
        fds = root / "proc" / str(pid) / "fd"
        fds.mkdir(parents=True)
        (root / "proc" / str(pid) / "comm").write_text("worker\n")
        for fd in range(10):
            (fds / str(fd)).symlink_to(f"/var/log/worker-{pid}-{fd}.log")
    (root / "proc" / "4242" / "fd" / "4").symlink_to("/dev/tenstorrent/1")
    run = _run(root, readlink='echo "$1" >> /readlink-calls; busybox readlink "$@"')
    assert run.returncode == 3
    assert "found: pid 4242 (tt-smi) holds /dev/tenstorrent/0" in run.stdout
    assert "found: pid 4242 (tt-smi) holds /dev/tenstorrent/1" in run.stdout
    assert "worker" not in run.stdout
    calls = root / "readlink-calls"
    assert not calls.exists(), f"{len(calls.read_text().splitlines())} readlink calls"


def test_reports_what_it_could_not_remove(tmp_path: Path) -> None:
    root = _host(tmp_path, loaded=False, dkms=False)
    stray = root / "opt" / "tenstorrent.ko"
    stray.parent.mkdir()
    stray.write_text("")
    run = _run(root, modprobe="return 0")
    assert run.returncode == 1
    assert "not vacated: modprobe still finds tenstorrent" in run.stdout


def test_the_pod_runs_pinned_privileged_with_the_host_root() -> None:
    pod = vacate_pod("node-1", "ops", "busybox:1.36")
    spec = pod["spec"]
    assert spec["nodeName"] == "node-1" and spec["hostPID"] is True
    assert spec["restartPolicy"] == "Never"
    container = spec["containers"][0]
    assert container["command"] == ["/bin/sh", "-c", REPORT, "vacate", SCRIPT]
    assert container["securityContext"] == {"privileged": True}


def test_the_report_is_the_termination_message_and_the_exit_code_the_scripts(
    tmp_path: Path,
) -> None:
    # The pod's own root (busybox, a termination-log file) with the host's at /host,
    # the held case: the whole report lands in the file and on stdout, with exit 3.
    pod_root = tmp_path / "pod"
    (pod_root / "bin").mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy(busybox, pod_root / "bin" / "busybox")
    for tool in ("sh", "cat", "chroot"):
        (pod_root / "bin" / tool).symlink_to("busybox")
    (pod_root / "dev").mkdir()
    host = _host(tmp_path, holder=True)
    host.rename(pod_root / "host")
    tools = "\n".join(f"{name}() {{ {body}; }}" for name, body in FAKES.items())
    command = vacate_pod("node-1", "ops", "busybox:1.36")["spec"]["containers"][0]["command"]
    command[-1] = tools + "\n" + command[-1]
    run = subprocess.run(
        [shutil.which("chroot") or "chroot", str(pod_root), *command],
        capture_output=True,
        text=True,
        env={"PATH": "/bin"},
        check=False,
    )
    assert run.returncode == EXIT_HELD, run.stdout + run.stderr
    message = (pod_root / "dev" / "termination-log").read_text()
    assert "found: pid 4242 (tt-smi) holds /dev/tenstorrent/0" in message
    assert message.rstrip().splitlines()[-1].startswith("refused: /dev/tenstorrent is in use")
    assert run.stdout == message
