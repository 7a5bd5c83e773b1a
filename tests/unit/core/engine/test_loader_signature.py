"""A loader pod whose agent exited with the signature code: the node's reason says so."""

from __future__ import annotations

from typing import Any

import pytest

from kmodkit.agent.errors import ExitCode
from kmodkit.core.engine.kernel_mapping import resolve
from kmodkit.core.engine.loader_plan import Phase, plan
from kmodkit.core.engine.loader_pod import (
    LoaderPod,
    load_failure,
    loader_pod,
    loader_pod_view,
)
from tests.unit.core.engine.test_loader_plan import SETTINGS, module, node, outcome

REFUSED = (
    "the kernel refused the signature of module xe (/staging/extra/xe.ko): Key was rejected "
    'by service (EKEYREJECTED); modinfo: signed by "kmodkit test signer" with key 3F:0A (sha256)'
)


def crashing(exit_code: int, message: str, *, now: bool = False) -> dict[str, Any]:
    """The agent container's status: ended now, or crash-looping after it ended."""
    ended = {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}}
    if now:
        return {"name": "agent", "restartCount": 0, "state": ended}
    return {
        "name": "agent",
        "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": ended,
    }


def observed(*statuses: dict[str, Any], init: list[dict[str, Any]] | None = None) -> LoaderPod:
    m, n = module(), node("a")
    resolved = resolve(m, n.kernel)
    pod = loader_pod(m, n, resolved, SETTINGS)  # type: ignore[arg-type]
    pod["metadata"] |= {"uid": "uid-1", "creationTimestamp": "t1"}
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": list(statuses),
        "initContainerStatuses": init or [],
    }
    return loader_pod_view(pod)


@pytest.mark.parametrize("now", [True, False])
def test_the_view_keeps_the_agents_exit_code_and_message(now: bool) -> None:
    pod = observed(crashing(6, REFUSED + "\n", now=now))
    assert (pod.agent_exit_code, pod.agent_message) == (6, REFUSED)


def test_only_the_agent_containers_exit_counts() -> None:
    extractor = {"name": "module-extractor", "state": {"terminated": {"exitCode": 6}}}
    sidecar = {"name": "sidecar", "state": {"terminated": {"exitCode": 6, "message": "x"}}}
    pod = observed(sidecar, init=[extractor])
    assert (pod.agent_exit_code, pod.agent_message) == (0, "")
    assert load_failure(pod)[0] == "LoadFailed"


def test_the_signature_code_gives_its_own_reason_with_the_agents_message() -> None:
    pod = observed(crashing(ExitCode.SIGNATURE_REJECTED, REFUSED))
    assert load_failure(pod) == ("SignatureRejected", REFUSED)


@pytest.mark.parametrize("code", [ExitCode.FAILED, ExitCode.BUSY, ExitCode.USAGE])
def test_other_codes_stay_load_failed_with_the_pod_problem(code: int) -> None:
    pod = observed(crashing(code, "modprobe exited 1: Unknown symbol in module"))
    reason, message = load_failure(pod)
    assert reason == "LoadFailed"
    assert message == pod.problem and "Unknown symbol in module" in message


def test_a_node_whose_loader_is_refused_for_its_signature_reports_it() -> None:
    m, n = module(), node("a")
    pod = observed(crashing(ExitCode.SIGNATURE_REJECTED, REFUSED))
    p = plan(m, [n], [pod], {}, SETTINGS, {"a": []})
    o = outcome(p, "a")
    assert (o.phase, o.reason, o.message) == (Phase.FAILED, "SignatureRejected", REFUSED)
    # Any other failure keeps the generic reason.
    pod = observed(crashing(ExitCode.FAILED, "the image has no modules for kernel 6.8"))
    o = outcome(plan(m, [n], [pod], {}, SETTINGS, {"a": []}), "a")
    assert (o.phase, o.reason) == (Phase.FAILED, "LoadFailed")
    assert "the image has no modules for kernel 6.8" in o.message
