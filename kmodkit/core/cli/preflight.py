"""Preflight: what a Module would do on nodes running given kernels.

This answers, before a kernel upgrade reaches the fleet, whether every new
kernel has a mapping and which image (and build) it would get.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.kernel_mapping import NoMatch, ResolveError, resolve
from kmodkit.core.kernel import node_kernel


@dataclass(frozen=True)
class PreflightResult:
    """The outcome for one kernel."""

    kernel: str
    matched: bool
    mapping_index: int | None
    container_image: str | None
    build: bool
    """Whether a build is configured for this kernel's image."""
    error: str | None

    @property
    def ok(self) -> bool:
        """A mapping matched and resolved without error."""
        return self.matched and self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "matched": self.matched,
            "mappingIndex": self.mapping_index,
            "containerImage": self.container_image,
            "build": self.build,
            "error": self.error,
        }


def preflight(module: Module, kernels: Iterable[str]) -> list[PreflightResult]:
    """Resolve ``module`` for each kernel, as reported by a node.

    A kernel is taken as ``status.nodeInfo.kernelVersion`` shows it; the one
    trailing ``+`` some distributions add is dropped, as for real nodes.
    """
    return [_one(module, kernel) for kernel in kernels]


def _one(module: Module, reported: str) -> PreflightResult:
    try:
        resolved = resolve(module, node_kernel(reported))
    except ResolveError as err:
        matched = err.mapping_index is not None
        return PreflightResult(reported, matched, err.mapping_index, None, False, str(err))
    if isinstance(resolved, NoMatch):
        return PreflightResult(reported, False, None, None, False, None)
    return PreflightResult(
        reported,
        True,
        resolved.mapping_index,
        resolved.container_image,
        resolved.build is not None,
        None,
    )
