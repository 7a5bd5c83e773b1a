"""Kernel version strings and the template variables derived from them.

A node reports its kernel in ``status.nodeInfo.kernelVersion``. Two spellings
of the same kernel are in play: the raw one, which is what ``uname -r`` prints
and what a Dockerfile needs to find ``/lib/modules/<kernel>``, and a normalised
one, which is safe inside an image tag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Template variables, in the order error messages list them.
KERNEL_FULL_VERSION = "KERNEL_FULL_VERSION"
KERNEL_VERSION = "KERNEL_VERSION"
KERNEL_XYZ = "KERNEL_XYZ"
KERNEL_X = "KERNEL_X"
KERNEL_Y = "KERNEL_Y"
KERNEL_Z = "KERNEL_Z"
MOD_NAME = "MOD_NAME"
MOD_NAMESPACE = "MOD_NAMESPACE"
TEMPLATE_VARIABLES = (
    KERNEL_FULL_VERSION,
    KERNEL_VERSION,
    KERNEL_XYZ,
    KERNEL_X,
    KERNEL_Y,
    KERNEL_Z,
    MOD_NAME,
    MOD_NAMESPACE,
)

_COMPONENT_SEPARATOR = re.compile(r"[.,-]")
_NOT_TAG_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def node_kernel(kernel_version: str) -> str:
    """The kernel of a node, from its ``status.nodeInfo.kernelVersion``.

    Some distributions report a trailing ``+`` that is not part of the
    directory name under ``/lib/modules``; KMM drops exactly one, and so do we.
    """
    return kernel_version.removesuffix("+")


def normalize_for_tag(kernel: str) -> str:
    """The kernel spelt with image-tag characters only (``1.2.3+4`` -> ``1.2.3_4``)."""
    return _NOT_TAG_SAFE.sub("_", kernel)


def dns_safe(kernel: str) -> str:
    """The kernel spelt for object names and label values (``5.14.0_A`` -> ``5-14-0-a``)."""
    return normalize_for_tag(kernel).lower().replace("_", "-").replace(".", "-").strip("-")


@dataclass(frozen=True)
class TemplateValues:
    """Values for template substitution, and why any known variable has none."""

    values: Mapping[str, str]
    unavailable: Mapping[str, str]


def template_values(kernel: str, *, name: str, namespace: str, for_tag: bool) -> TemplateValues:
    """The template variables for one kernel and Module.

    ``for_tag`` selects the normalised kernel, for image references; build
    arguments get the raw kernel, the same value as the ``KERNEL_VERSION``
    build argument kmodkit injects, so a Dockerfile sees one spelling only.
    (KMM uses the normalised form for images and does not template build
    arguments at all.)

    The X, Y and Z components need a kernel of at least three components split
    on ``.``, ``,`` or ``-``; for a shorter kernel they are unavailable, and
    only a template that uses them fails.
    """
    full = normalize_for_tag(kernel) if for_tag else kernel
    values = {
        KERNEL_FULL_VERSION: full,
        KERNEL_VERSION: full,
        MOD_NAME: name,
        MOD_NAMESPACE: namespace,
    }
    unavailable: dict[str, str] = {}
    components = _COMPONENT_SEPARATOR.split(full)
    if len(components) >= 3:
        x, y, z = components[:3]
        values |= {KERNEL_XYZ: f"{x}.{y}.{z}", KERNEL_X: x, KERNEL_Y: y, KERNEL_Z: z}
    else:
        reason = f"kernel {kernel!r} has fewer than three components separated by '.', ',' or '-'"
        unavailable = dict.fromkeys((KERNEL_XYZ, KERNEL_X, KERNEL_Y, KERNEL_Z), reason)
    return TemplateValues(values, unavailable)
