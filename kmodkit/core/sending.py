"""Writes whose answer the caller does not read.

The kubernetes client decodes every answer into its typed models: about a millisecond
for a loader pod, the object the apiserver sends back after a create. The engine never
reads those answers (its watches show what landed), and it writes a pod, a label and an
Event per node of a fleet. ``send`` asks for the raw answer and reads it whole,
undecoded, so its connection goes back to the pool; a refusal still raises
``ApiException``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def send(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)`` (a kubernetes client method), its answer read and dropped."""
    call(*args, **kwargs, _preload_content=False).read()
