"""``kubectl kmodkit`` against the real operator rolling a Tenstorrent driver over kwok nodes.

``status --watch`` runs in a detached tmux session of a fixed size while a
version change rolls one node at a time; the captured screen must show the
policy, its progress bar, the nodes by state and what holds the others back,
redrawn in place. Each verb then runs through kubectl's plugin lookup against
the same apiserver: it must have changed what it printed, and a second run
must change nothing and say so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kmodkit_dev import build
from kmodkit_dev.waiting import wait_until
from tests.integration.test_tt_support import (
    DRIVER,
    FIRMWARE,
    FakeBuilder,
    add_fleet,
    create_policy,
    delete_nodes,
    delete_policy,
    label_node,
    node_labels,
    patch_policy,
    tt_operator,
)
from tests.unit.examples import minimal

pytestmark = pytest.mark.cluster

KMD = "driver.tenstorrent.com/kmd-version"
SKIP_LABELS = ("driver.tenstorrent.com/skip", "firmware.tenstorrent.com/skip")
SCREEN = (160, 50)


@dataclass
class Rollout:
    api: Any
    kubeconfig: str
    tag: str
    nodes: list[str]
    policy: str

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``kubectl kmodkit …``, found on PATH the way kubectl finds plugins."""
        return subprocess.run(
            [str(build.binary("kubectl")), "kmodkit", *args],
            env=_env(self.kubeconfig),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def ok(self, *args: str) -> list[str]:
        out = self.kubectl(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    def refused(self, *args: str) -> str:
        out = self.kubectl(*args)
        assert out.returncode == 1, out.stdout
        return " ".join(out.stderr.split())

    def spec(self, kind: tuple[str, str, str]) -> dict[str, Any]:
        obj = client.CustomObjectsApi(self.api).get_cluster_custom_object(*kind, self.policy)
        return dict(obj["spec"])


def _env(kubeconfig: str) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "KUBECONFIG": kubeconfig, "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def rollout(
    dev_cluster: Any, kubeconfig: str, kube_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rollout]:
    build.ensure(["kubernetes"])
    tag = uuid.uuid4().hex[:6]
    with tt_operator(kubeconfig, kube_api, tmp_path_factory.mktemp("kk"), builders_played=True) as (
        _,
        namespace,
    ):
        r = Rollout(kube_api, kubeconfig, tag, [f"kk-{tag}-{i}" for i in range(3)], f"kk-{tag}")
        add_fleet(dev_cluster, kube_api, r.nodes, {"kk-test": tag})
        builder = FakeBuilder(kube_api, namespace)
        create_policy(
            kube_api,
            DRIVER,
            {
                "apiVersion": "driver.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentDriverPolicy",
                "metadata": {"name": r.policy},
                "spec": {"version": "2.8.0", "nodeAffinity": {"matchLabels": {"kk-test": tag}}},
            },
        )
        # A paused firmware policy of the same name that covers no node.
        create_policy(
            kube_api,
            FIRMWARE,
            {
                "apiVersion": "firmware.tenstorrent.com/v1alpha1",
                "kind": "TenstorrentFirmwarePolicy",
                "metadata": {"name": r.policy},
                "spec": {
                    "version": "19.9.0",
                    "paused": True,
                    "nodeAffinity": {"matchLabels": {"kk-none": tag}},
                },
            },
        )
        try:
            wait_until(
                lambda: all(node_labels(kube_api, n).get(KMD) == "2.8.0" for n in r.nodes),
                "tt-kmd 2.8.0 on every node",
                timeout=60,
            )
            yield r
        finally:
            builder.stop()
            delete_policy(kube_api, DRIVER, r.policy)
            delete_policy(kube_api, FIRMWARE, r.policy)
            delete_nodes(kube_api, r.nodes)
        assert not builder.poller.errors, builder.poller.errors


class Tmux:
    """A private tmux server (its own socket) with one detached session of a fixed size."""

    def __init__(self, tmp: Path, command: list[str], env: dict[str, str]) -> None:
        tmux = shutil.which("tmux")
        assert tmux, "tmux is missing (make system-deps installs it)"
        conf = tmp / "tmux.conf"
        # Keep the pane when the command exits, so a crash is on screen, not lost.
        conf.write_text("set -g remain-on-exit on\n", encoding="utf-8")
        self._base = [tmux, "-S", str(tmp / "tmux.sock"), "-f", str(conf)]
        width, height = SCREEN
        # The server starts with ``env`` and gives it to the command, which, given as
        # several arguments, tmux runs itself: no shell in between.
        self._env = env
        self._run("new-session", "-d", "-x", str(width), "-y", str(height), *command)

    def _run(self, *args: str) -> str:
        return subprocess.run(
            [*self._base, *args],
            env=self._env,
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout

    def screen(self) -> str:
        """The pane and its whole scroll-back history."""
        return self._run("capture-pane", "-p", "-S", "-")

    def wait_for(self, shows: Callable[[str], bool], timeout: float) -> str:
        """The first screen that ``shows`` accepts; failing, the last one seen."""
        deadline = time.monotonic() + timeout
        while not shows(screen := self.screen()):
            if time.monotonic() > deadline:
                pytest.fail(f"not on screen after {timeout:.0f}s; the screen:\n{screen}")
            time.sleep(0.3)
        return screen

    def close(self) -> None:
        self._run("kill-server")


def test_status_watch_redraws_a_live_rollout_in_place(rollout: Rollout, tmp_path: Path) -> None:
    r = rollout
    kubectl = str(build.binary("kubectl"))
    tmux = Tmux(
        tmp_path,
        [kubectl, "kmodkit", "status", "--watch", "--interval", "0.5"],
        _env(r.kubeconfig),
    )
    frames: list[str] = []
    try:
        first = tmux.wait_for(lambda s: r.policy in s and "3/3" in s, timeout=30)
        patch_policy(r.api, DRIVER, r.policy, {"spec": {"version": "2.9.0"}})
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            frames.append(tmux.screen())
            if all(node_labels(r.api, n).get(KMD) == "2.9.0" for n in r.nodes) and (
                "upToDate=3" in frames[-1] and "inProgress" not in frames[-1]
            ):
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"the rollout did not finish on screen; last frame:\n{frames[-1]}")
    finally:
        tmux.close()

    for screen in [first, *frames]:
        # One frame on the screen, never a scroll of them.
        assert screen.count("kmodkit status") == 1, screen
        assert screen.lstrip().startswith("kmodkit status"), screen
        for column in ("KIND", "PROGRESS", "NODES", "BLOCKING", "FAILURES"):
            assert column in screen
    line = next(ln for ln in first.splitlines() if r.policy in ln)
    assert "TenstorrentDriverPolicy" in line and "2.8.0" in line
    assert "█" * 20 + " 3/3" in line, line
    rolling = [f for f in frames if "inProgress=1" in f]
    assert rolling, "no frame caught a node in flight"
    partial = [f for f in rolling if any(f"{n}/3" in f for n in (0, 1, 2))]
    assert partial, "no frame showed the bar short of full"
    assert any("WaitingForSlot:" in f for f in rolling), f"waiting nodes not shown:\n{rolling[-1]}"
    assert "2.9.0" in frames[-1] and "█" * 20 + " 3/3" in frames[-1]
    assert len(set(frames)) > 2, "the screen did not change as the rollout advanced"


def test_pause_and_resume(rollout: Rollout) -> None:
    r = rollout
    field = f"ttdp/{r.policy}: spec.paused"
    assert r.ok("pause", f"ttdp/{r.policy}") == [f"{field}: false -> true"]
    assert r.spec(DRIVER)["paused"] is True
    assert r.ok("pause", f"ttdp/{r.policy}") == [f"ttdp/{r.policy} is already paused"]
    assert r.ok("resume", f"ttdp/{r.policy}") == [f"{field}: true -> false"]
    assert r.spec(DRIVER)["paused"] is False
    assert r.ok("resume", f"tenstorrentdriverpolicies/{r.policy}") == [
        f"ttdp/{r.policy} is already running"
    ]

    assert "no Module or policy named 'nope'" in r.refused("pause", "nope")
    # The fixture's firmware policy has the same name: the bare name is ambiguous.
    assert f"names more than one object; say which: ttdp/{r.policy}, ttfwp/{r.policy}" in (
        r.refused("pause", r.policy)
    )
    assert r.ok("resume", f"ttfwp/{r.policy}") == [f"ttfwp/{r.policy}: spec.paused: true -> false"]
    assert r.spec(FIRMWARE)["paused"] is False


def test_skip_and_unskip(rollout: Rollout) -> None:
    r = rollout
    node = r.nodes[0]
    assert r.ok("skip", node) == [f"node/{node}: label {k}: (unset) -> true" for k in SKIP_LABELS]
    assert all(node_labels(r.api, node)[k] == "true" for k in SKIP_LABELS)
    assert r.ok("skip", node) == [f"node/{node} is already skipped by {', '.join(SKIP_LABELS)}"]
    assert r.ok("unskip", node, "--kind", "ttfwp") == [
        f"node/{node}: label {SKIP_LABELS[1]}: true -> (unset)"
    ]
    assert r.ok("unskip", node) == [f"node/{node}: label {SKIP_LABELS[0]}: true -> (unset)"]
    assert not set(SKIP_LABELS) & set(node_labels(r.api, node))
    assert r.ok("unskip", node) == [
        f"node/{node} is already not skipped by {', '.join(SKIP_LABELS)}"
    ]
    assert "no node named 'nope' (kubectl get nodes)" in r.refused("skip", "nope")


def test_retry_clears_only_a_failed_state(rollout: Rollout) -> None:
    """The firmware policy covers no node: the node stands for one that failed in its
    rollout and then left the request, which the rollout holds cordoned until the admin
    acts. Retry clears only that state label; the rollout then releases the node."""
    r = rollout
    node = r.nodes[1]
    core = client.CoreV1Api(r.api)
    key = f"rollout.kmodkit.io/ttfwp.{r.policy}"
    # One write, so no pass sees a failed node without its cordon (which it would release).
    core.patch_node(
        node,
        {
            "metadata": {"labels": {key: "failed"}, "annotations": {f"{key}.cordon": "rollout"}},
            "spec": {"unschedulable": True},
        },
    )
    done = r.refused("retry", node, "--policy", f"ttdp/{r.policy}")
    assert f"node/{node} is done in rollout ttdp.{r.policy}, not failed" in done
    assert r.ok("retry", node, "--policy", f"ttfwp/{r.policy}") == [
        f"node/{node}: label {key}: failed -> (unset)"
    ]

    def released() -> bool:
        after = core.read_node(node)
        return not after.spec.unschedulable and f"{key}.cordon" not in (
            after.metadata.annotations or {}
        )

    wait_until(released, timeout=60, what=f"the firmware rollout to release {node}")
    after = core.read_node(node).metadata
    assert key not in after.labels, "the state label stays"
    assert after.labels[f"rollout.kmodkit.io/ttdp.{r.policy}"] == "done"
    assert r.ok("retry", node, "--policy", f"ttfwp/{r.policy}") == [
        f"node/{node} is already idle in rollout ttfwp.{r.policy}"
    ]


def test_upgrade_labels_the_node_for_the_module(rollout: Rollout) -> None:
    r = rollout
    core = client.CoreV1Api(r.api)
    namespace = f"kk-{r.tag}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        module = minimal(version="v2")
        module["metadata"] = {"name": "xe", "namespace": namespace}
        module["spec"]["selector"] = {"kk-none": r.tag}
        client.CustomObjectsApi(r.api).create_namespaced_custom_object(
            "kmodkit.io", "v1alpha1", namespace, "modules", module
        )
        node = r.nodes[2]
        key = f"kmm.node.kubernetes.io/version-module.{namespace}.xe"
        args = ("upgrade", node, "--module", f"{namespace}/xe", "--version", "v2")
        assert r.ok(*args) == [f"node/{node}: label {key}: (unset) -> v2"]
        assert node_labels(r.api, node)[key] == "v2"
        assert r.ok(*args) == [f"node/{node}: label {key} is already v2"]
        ahead = r.ok("upgrade", node, "--module", f"{namespace}/xe", "--version", "v3")
        assert ahead[0] == f"node/{node}: label {key}: v2 -> v3"
        assert ahead[1].startswith(f"note: Module {namespace}/xe is at version v2")
        assert f"no Module {namespace}/nope" in r.refused(
            "upgrade", node, "--module", f"{namespace}/nope", "--version", "v2"
        )
        label_node(r.api, node, {key: None})
    finally:
        core.delete_namespace(namespace)
