"""Exit codes of ``kmodkit-agent`` and the failures that carry them.

The codes are a contract with the loader pods and the operator that reads their
status: keep them stable and documented in docs/node-agent.md.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    BUSY = 3
    HOST_MANAGED = 4
    NOT_READY = 5
    SIGNATURE_REJECTED = 6


class AgentError(Exception):
    """A failure the agent reports as one log line and an exit code."""

    exit_code = ExitCode.FAILED
    event = "failed"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields


class ConfigError(AgentError):
    exit_code = ExitCode.USAGE
    event = "config.invalid"


class DeviceBusy(AgentError):
    exit_code = ExitCode.BUSY
    event = "unload.refused"


class HostManaged(AgentError):
    exit_code = ExitCode.HOST_MANAGED
    event = "host_managed"


class SignatureRejected(AgentError):
    """The kernel refused a module for its signature (unsigned, or a key it does not trust)."""

    exit_code = ExitCode.SIGNATURE_REJECTED
    event = "load.signature_rejected"
