"""Pure decisions: from what the kernel has loaded to what the agent must do.

No I/O here. Each function takes observations (``ModuleObservation``) and the
configured intent, and returns a decision the action layer carries out and logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from kmodkit.agent.kernel_state import ModuleObservation, Presence, kernel_name


def readiness_problems(
    loading_order: Sequence[str],
    observed: Mapping[str, ModuleObservation],
    expected_version: str | None,
    replaces_in_tree: frozenset[str] = frozenset(),
    expected_srcversions: Mapping[str, str] | None = None,
) -> list[str]:
    """Why the driver is not ready; empty when every module is live at the right version.

    ``replaces_in_tree`` names modules that share their name with an in-tree
    module; loaded without the out-of-tree taint, they are the in-tree one.
    ``expected_srcversions`` are the srcversions of the modules this agent
    carries: a loaded module with another one is another build (an old driver
    whose unload failed, say), and is never reported ready.
    """
    problems = [
        problem
        for name in loading_order
        if (problem := _module_problem(name, observed[name], replaces_in_tree))
    ]
    version_problem = _version_problem(loading_order[-1], observed, expected_version)
    identity = _identity_problems(loading_order, observed, expected_srcversions or {})
    return problems + ([version_problem] if version_problem else []) + identity


def _identity_problems(
    loading_order: Sequence[str],
    observed: Mapping[str, ModuleObservation],
    expected: Mapping[str, str],
) -> list[str]:
    return [
        f"{name} loaded is another build (srcversion {seen.srcversion or 'unset'}, "
        f"expected {expected[name]})"
        for name in loading_order
        if expected.get(name)
        and (seen := observed[name]).presence is Presence.LOADED
        and seen.srcversion != expected[name]
    ]


def _module_problem(
    name: str, seen: ModuleObservation, replaces_in_tree: frozenset[str]
) -> str | None:
    if seen.presence is Presence.ABSENT:
        return f"{name} is not loaded"
    if seen.presence is Presence.BUILTIN:
        return f"{name} is built into the kernel"
    if seen.initstate != "live":
        return f"{name} is {seen.initstate or 'in an unknown state'}, not live"
    if name in replaces_in_tree and not seen.out_of_tree:
        return f"{name} is loaded, but it is the in-tree module"
    return None


def _version_problem(
    top: str, observed: Mapping[str, ModuleObservation], expected: str | None
) -> str | None:
    seen = observed[top]
    if expected is None or seen.presence is not Presence.LOADED or seen.version == expected:
        return None
    return f"{top} version is {seen.version or 'unset'}, expected {expected}"


class LoadAction(StrEnum):
    NOTHING = "nothing"
    LOAD = "load"
    REPLACE = "replace"
    BLOCKED = "blocked"


@dataclass(frozen=True)
class LoadDecision:
    action: LoadAction
    reasons: tuple[str, ...] = ()
    # For REPLACE: the modules to unload first, in unloading order.
    unload_first: tuple[str, ...] = ()


def decide_load(
    loading_order: Sequence[str],
    observed: Mapping[str, ModuleObservation],
    expected_version: str | None,
    replaces_in_tree: frozenset[str] = frozenset(),
    expected_srcversions: Mapping[str, str] | None = None,
) -> LoadDecision:
    problems = tuple(
        readiness_problems(
            loading_order, observed, expected_version, replaces_in_tree, expected_srcversions
        )
    )
    if not problems:
        return LoadDecision(LoadAction.NOTHING)
    if any(observed[n].presence is Presence.BUILTIN for n in loading_order):
        return LoadDecision(LoadAction.BLOCKED, problems)
    loaded = [n for n in loading_order if observed[n].presence is Presence.LOADED]
    wrong = [n for n in loaded if _module_problem(n, observed[n], replaces_in_tree)]
    if (
        wrong
        or _version_problem(loading_order[-1], observed, expected_version)
        or _identity_problems(loading_order, observed, expected_srcversions or {})
    ):
        # A stale module must go before its replacement can load, and with it
        # every module of ours that links against it.
        return LoadDecision(LoadAction.REPLACE, problems, tuple(reversed(loaded)))
    return LoadDecision(LoadAction.LOAD, problems)


@dataclass(frozen=True)
class UnloadAssessment:
    """Whether the loaded modules can be removed, and what holds them if not."""

    loaded: tuple[str, ...]
    # Modules outside our set that link against ours: no signal frees those.
    foreign_users: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # References not explained by module users: open files, mostly.
    process_refs: dict[str, int] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self.foreign_users or self.process_refs)


def assess_unload(
    unloading_order: Sequence[str], observed: Mapping[str, ModuleObservation]
) -> UnloadAssessment:
    ours = {kernel_name(n) for n in unloading_order}
    loaded = tuple(n for n in unloading_order if observed[n].presence is Presence.LOADED)
    foreign: dict[str, tuple[str, ...]] = {}
    process_refs: dict[str, int] = {}
    for name in loaded:
        seen = observed[name]
        others = tuple(u for u in seen.used_by if u not in ours)
        if others:
            foreign[name] = others
        # Each module that uses this one holds exactly one reference to it.
        extra = seen.refcnt - len(seen.used_by)
        if extra > 0:
            process_refs[name] = extra
    return UnloadAssessment(loaded, foreign, process_refs)


@dataclass(frozen=True)
class InTreeRemoval:
    remove: tuple[str, ...]
    builtin: tuple[str, ...]
    absent: tuple[str, ...]


def plan_in_tree_removal(
    names: Sequence[str], observed: Mapping[str, ModuleObservation]
) -> InTreeRemoval:
    """Which in-tree modules to remove, each after the listed modules that use it."""
    loaded = [n for n in names if observed[n].presence is Presence.LOADED]
    builtin = tuple(n for n in names if observed[n].presence is Presence.BUILTIN)
    absent = tuple(n for n in names if observed[n].presence is Presence.ABSENT)
    removing = {kernel_name(n) for n in loaded}
    order: list[str] = []
    pending = list(loaded)
    while pending:
        done = {kernel_name(n) for n in order}
        ready = [
            n for n in pending if all(u in done or u not in removing for u in observed[n].used_by)
        ]
        # The kernel forbids dependency cycles, so something is always ready.
        order.append(ready[0])
        pending.remove(ready[0])
    return InTreeRemoval(tuple(order), builtin, absent)
