"""DKMS detection: either signal hands the driver to the host; both must go."""

from __future__ import annotations

import pytest

from kmodkit.agent.errors import HostManaged
from kmodkit.agent.host_mode import InstallMode, detect_host_mode
from tests.node.harness import DEP, TOP, Node


def test_neither_signal_means_container_mode(node: Node) -> None:
    report = detect_host_mode(node.host, [TOP])
    assert report.mode is InstallMode.CONTAINER
    assert report.signals == ()


def test_dkms_state_directory_alone_means_host_mode(node: Node) -> None:
    (node.root / "var/lib/dkms/tenstorrent/2.8.0").mkdir(parents=True)
    report = detect_host_mode(node.host, [TOP])
    assert report.mode is InstallMode.HOST
    assert [(s.kind, s.path) for s in report.signals] == [
        ("dkms-state", "/var/lib/dkms/tenstorrent")
    ]


def test_dkms_source_registration_alone_means_host_mode(node: Node) -> None:
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf", 'PACKAGE_NAME="tenstorrent"\n')
    report = detect_host_mode(node.host, [TOP])
    assert report.mode is InstallMode.HOST
    assert [(s.kind, s.path) for s in report.signals] == [
        ("dkms-source", "/usr/src/tenstorrent-2.8.0/dkms.conf")
    ]


def test_both_signals_are_all_reported(node: Node) -> None:
    (node.root / "var/lib/dkms/tenstorrent").mkdir(parents=True)
    node.write_host("/usr/src/tenstorrent-2.7.0/dkms.conf")
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")
    report = detect_host_mode(node.host, [TOP])
    assert report.mode is InstallMode.HOST
    assert [s.path for s in report.signals] == [
        "/var/lib/dkms/tenstorrent",
        "/usr/src/tenstorrent-2.7.0/dkms.conf",
        "/usr/src/tenstorrent-2.8.0/dkms.conf",
    ]


def test_near_misses_are_not_signals(node: Node) -> None:
    node.write_host("/var/lib/dkms/tenstorrent")  # a file, not DKMS's directory
    node.write_host("/usr/src/tenstorrent-2.8.0/Makefile")  # sources without dkms.conf
    node.write_host("/usr/src/tenstorrentfoo/dkms.conf")  # another package's name
    (node.root / "var/lib/dkms/other").mkdir(parents=True)
    assert detect_host_mode(node.host, [TOP]).mode is InstallMode.CONTAINER


def test_host_managed_node_is_never_touched(node: Node) -> None:
    node.image_pair()
    node.preload_pair("2.8.0")
    (node.root / "var/lib/dkms/tenstorrent").mkdir(parents=True)
    node.kernel.calls.clear()

    with pytest.raises(HostManaged):
        node.agent().load()
    with pytest.raises(HostManaged):
        node.agent().unload(force=True)

    assert node.kernel.calls == []
    assert node.loaded() == [DEP, TOP]
    detected = node.events("host_mode.detected")[0]
    assert detected["install_mode"] == "host"
    assert detected["signals"] == [{"kind": "dkms-state", "path": "/var/lib/dkms/tenstorrent"}]


def test_the_dkms_names_default_to_the_module_and_can_be_turned_off(node: Node) -> None:
    node.image_pair()
    (node.root / "var/lib/dkms/tenstorrent").mkdir(parents=True)
    assert node.config().dkms_names == [TOP]

    node.agent(node.config(dkmsModules=[])).load()

    assert node.loaded() == [DEP, TOP]


def test_removing_one_signal_is_not_enough_to_take_over(node: Node) -> None:
    node.image_pair()
    (node.root / "var/lib/dkms/tenstorrent").mkdir(parents=True)
    node.write_host("/usr/src/tenstorrent-2.8.0/dkms.conf")
    (node.root / "var/lib/dkms/tenstorrent").rmdir()

    with pytest.raises(HostManaged):
        node.agent().load()

    (node.root / "usr/src/tenstorrent-2.8.0/dkms.conf").unlink()
    node.agent().load()
    assert node.loaded() == [DEP, TOP]
