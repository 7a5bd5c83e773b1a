"""Deleting a firmware policy waits for the flashes it started.

A flash cut off half-way can brick a card, so a flash Job is owned by no one
the garbage collector follows (not even a foreground deletion can take it),
and the policy keeps its finalizer while any of its Jobs still runs: the node
stays cordoned under the flash, and is released when the Job has finished or
its deadline (``flashTimeoutSeconds``) has failed it. A list that fails counts
as a flash running: a guard that lets go when it cannot look is no guard.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.firmware_job import job_outcome
from kmodkit.backends.tenstorrent.status_common import condition
from kmodkit.sdk import ClusterView, Obj

MAX_NAMED = 5
_PAGE = 500


def running_flashes(policy: Obj, jobs: Sequence[Obj]) -> list[str]:
    """``node (Job name)`` of each of ``policy``'s flash Jobs that has not finished."""
    uid = (policy.get("metadata") or {}).get("uid")
    running = []
    for job in jobs:
        meta = job.get("metadata") or {}
        owner = (meta.get("annotations") or {}).get(keys.TT_FLASH_POLICY_UID_ANNOTATION)
        if owner not in (None, uid) or job_outcome(job) != "running":
            continue
        node = (meta.get("labels") or {}).get(keys.TT_FIRMWARE_NODE_LABEL, "?")
        running.append(f"{node} (Job {meta.get('name')})")
    return sorted(running)


def _jobs(api: Any, namespace: str, policy: str) -> Iterator[Obj]:
    batch = client.BatchV1Api(api)
    token = None
    while True:
        resp: Any = batch.list_namespaced_job(
            namespace,
            label_selector=f"{keys.TT_FIRMWARE_POLICY_LABEL}={names.label_value(policy)}",
            limit=_PAGE,
            _continue=token,
            _preload_content=False,
        )
        page = json.loads(resp.data)
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def hold_deletion(body: Obj, view: ClusterView, api: Any) -> dict[str, Any] | None:
    """The status to show while the policy's deletion must wait, or None to let it go."""
    name = str((body.get("metadata") or {}).get("name", ""))
    try:
        jobs = list(_jobs(api, view.operator_namespace, name))
    except client.ApiException as err:
        message = (
            f"cannot list the flash Jobs ({err.status} {err.reason}), so the deletion waits: "
            "a flash may be running; grant the operator list on jobs.batch or check the API server"
        )
    else:
        running = running_flashes(body, jobs)
        if not running:
            return None
        shown = ", ".join(running[:MAX_NAMED]) + (
            f" and {len(running) - MAX_NAMED} more" if len(running) > MAX_NAMED else ""
        )
        message = (
            f"the deletion waits for the flash of {shown}: a flash cut off can brick the card; "
            "each node is released once its Job finishes or fails at flashTimeoutSeconds"
        )
    previous = dict(body.get("status") or {})
    generation = (body.get("metadata") or {}).get("generation")
    others = [c for c in previous.get("conditions") or [] if c.get("type") != "Progressing"]
    progressing = condition(
        previous,
        "Progressing",
        "True",
        "DeletionWaitsForFlash",
        message,
        generation,
        datetime.now(UTC),
    )
    return {**previous, "conditions": [*others, progressing]}
