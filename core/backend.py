"""The contract between kmodkit's runtime and a backend plugin.

A backend is a plain object registered under the entry-point group
``kmodkit.backends``. The runtime discovers it, checks that it was written for a
contract version this runtime speaks, and wires its resources the same way for
every backend, built-in or third-party.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENTRY_POINT_GROUP = "kmodkit.backends"

# Bumped on any incompatible change to Backend or Resource; a backend declares
# the version it was written for and the runtime refuses any other.
CONTRACT_VERSION = 1


@dataclass(frozen=True)
class Resource:
    """One custom resource a backend serves."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = False


@dataclass(frozen=True)
class Backend:
    """What a backend declares to the runtime."""

    name: str
    version: str
    contract: int
    description: str = ""
    resources: tuple[Resource, ...] = field(default=())
