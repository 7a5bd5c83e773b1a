"""Names of the objects a Tenstorrent policy owns, and label-safe forms of policy names."""

from __future__ import annotations

import hashlib

MAX_LABEL_VALUE = 63


def short_hash(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def fit(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else a prefix plus a hash of the whole.

    Two long names that share a prefix still get different results.
    """
    if len(text) <= limit:
        return text
    digest = short_hash(text, 10)
    return f"{text[: limit - len(digest) - 1].rstrip('-.')}-{digest}"


def label_value(name: str) -> str:
    """A policy or node name as a label value (at most 63 characters)."""
    return fit(name, MAX_LABEL_VALUE)


def driver_policy_id(name: str) -> str:
    """The rollout id of a driver policy; it scopes the rollout's keys on the nodes."""
    return f"ttdp.{name}"


def firmware_policy_id(name: str) -> str:
    return f"ttfwp.{name}"


def daemonset_name(policy: str) -> str:
    # The DaemonSet controller names pods <ds>-<5 chars> and revisions
    # <ds>-<10 chars>; keeping the name a label value leaves room for both.
    return fit(f"ttdrv-{policy}", MAX_LABEL_VALUE - 11)


def flash_job_name(policy: str, node: str, version: str) -> str:
    """One flash Job per (policy, node, version): readable, and unique by a hash of all three.

    A Job's pods carry the Job name in a label, so it stays within 63 characters.
    """
    digest = short_hash(f"{policy}/{node}/{version}", 8)
    readable = f"ttfwp-{policy}-{node}"[:40].rstrip("-.")
    return f"{readable}-{version.replace('.', '-')}-{digest}".lower()
