"""Owner references: how every object kmodkit creates points at the resource it serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def controller_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The ownerReference that makes ``owner`` (a whole object) the controller of another.

    The garbage collector deletes the owned object with its owner, and a
    foreground deletion of the owner waits for it (``blockOwnerDeletion``).
    """
    meta = owner.get("metadata") or {}
    return {
        "apiVersion": owner.get("apiVersion"),
        "kind": owner.get("kind"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }
