"""Writes whose answer the caller does not read.

The kubernetes client decodes every answer into its typed models: about a millisecond
for a pod and more for a node, the object the apiserver sends back after a create or a
patch. The engine never reads those answers (its watches show what landed), and it
writes a pod, a label and an Event per node: at 10,000 nodes the models alone would
cost the operator half a minute of CPU, on cores it shares with the apiserver in a
small cluster. ``send`` asks for the raw answer and reads it whole, undecoded, so its
connection goes back to the pool; a refusal still raises ``ApiException``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def send(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)`` (a kubernetes client method), its answer read and dropped."""
    call(*args, **kwargs, _preload_content=False).read()
