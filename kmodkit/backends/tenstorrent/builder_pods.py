"""What the operator reads from a builder pod: which template it runs and how it is doing."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.driver_daemonset import CONTAINER, FORCE_UNLOAD_ENV

CRASH_LOOP_RESTARTS = 3
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
MAX_MESSAGE = 600
FIELDS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.labels",
    "metadata.annotations",
    "metadata.deletionTimestamp",
    "spec.nodeName",
    f"spec.containers[name={CONTAINER}].name",
    f"spec.containers[name={CONTAINER}].env[name={FORCE_UNLOAD_ENV}]",
    "status.conditions[type=Ready]",
    f"status.containerStatuses[name={CONTAINER}].name",
    f"status.containerStatuses[name={CONTAINER}].state",
    f"status.containerStatuses[name={CONTAINER}].lastState",
    f"status.containerStatuses[name={CONTAINER}].restartCount",
)
"""What ``builder_pod`` and the owners' checks read of a builder pod: all the operator keeps
of one, on every node."""


@dataclass(frozen=True)
class BuilderPod:
    name: str
    namespace: str
    node: str
    template_hash: str
    force_unload: bool
    ready: bool
    deleting: bool
    image_pull_problem: str = ""
    """The kubelet's waiting reason when the image cannot be pulled."""
    crash_loop: bool = False
    last_error: str = ""
    """What the builder said when it last stopped (holders, build errors)."""


def _env(container: Mapping[str, Any], name: str) -> str:
    for entry in container.get("env") or []:
        if entry.get("name") == name:
            return str(entry.get("value") or "")
    return ""


def _readable(message: str) -> str:
    """The builder's termination message: its JSON error line made readable, or the log tail."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("message"):
            text = str(record["message"])
            holders = record.get("holders") or []
            named = ", ".join(
                f"pid {h.get('pid')} ({h.get('comm', '?')})" for h in holders if isinstance(h, dict)
            )
            return f"{text} [holders: {named}]" if named else text
    return (lines[-1] if lines else "")[:MAX_MESSAGE]


def builder_pod(pod: Mapping[str, Any]) -> BuilderPod:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    container: Mapping[str, Any] = next(
        (c for c in spec.get("containers") or [] if c.get("name") == CONTAINER), {}
    )
    state: Mapping[str, Any] = next(
        (s for s in status.get("containerStatuses") or [] if s.get("name") == CONTAINER), {}
    )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    waiting = (state.get("state") or {}).get("waiting") or {}
    terminated = (state.get("lastState") or {}).get("terminated") or (
        (state.get("state") or {}).get("terminated") or {}
    )
    restarts = int(state.get("restartCount") or 0)
    reason = str(waiting.get("reason") or "")
    return BuilderPod(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        node=str(spec.get("nodeName") or ""),
        template_hash=str(
            (meta.get("annotations") or {}).get(keys.TT_TEMPLATE_HASH_ANNOTATION, "")
        ),
        force_unload=_env(container, FORCE_UNLOAD_ENV) == "true",
        ready=ready,
        deleting=meta.get("deletionTimestamp") is not None,
        image_pull_problem=reason if reason in IMAGE_PULL_REASONS else "",
        crash_loop=not ready and (reason == "CrashLoopBackOff" or restarts >= CRASH_LOOP_RESTARTS),
        last_error=_readable(str(terminated.get("message") or "")),
    )


def pods_by_node(pods: Iterable[Mapping[str, Any]], policy: str) -> dict[str, BuilderPod]:
    """This policy's builder pods by node; a live pod wins over one being deleted."""
    mine = names.label_value(policy)
    found: dict[str, BuilderPod] = {}
    for raw in pods:
        if ((raw.get("metadata") or {}).get("labels") or {}).get(
            keys.TT_DRIVER_POLICY_LABEL
        ) != mine:
            continue
        pod = builder_pod(raw)
        if not pod.node:
            continue
        current = found.get(pod.node)
        if current is None or (current.deleting and not pod.deleting):
            found[pod.node] = pod
    return found
