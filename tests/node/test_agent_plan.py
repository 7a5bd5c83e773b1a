"""Pure decisions and parsers, by example and by property."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kmodkit.agent.kernel_state import (
    ModuleObservation,
    Presence,
    parse_modules_builtin,
    parse_proc_modules,
)
from kmodkit.agent.plan import LoadAction, assess_unload, decide_load, plan_in_tree_removal

PROC_MODULES = """\
tenstorrent 61440 1 - Live 0xffffffffc0a00000 (OE)
tt_helper 16384 1 tenstorrent, Live 0xffffffffc09f0000 (OE)
ice 1048576 2 irdma,ice_swx, Live 0xffffffffc0800000
nvme_core 212992 0 - Loading 0xffffffffc0700000
"""


def live(
    name: str,
    *,
    refcnt: int = 0,
    used_by: tuple[str, ...] = (),
    version: str | None = None,
    out_of_tree: bool = True,
) -> ModuleObservation:
    return ModuleObservation(name, Presence.LOADED, "live", refcnt, version, used_by, out_of_tree)


def absent(name: str) -> ModuleObservation:
    return ModuleObservation(name, Presence.ABSENT)


def test_parses_proc_modules() -> None:
    modules = parse_proc_modules(PROC_MODULES)
    assert modules["tenstorrent"].used_by == ()
    assert modules["tt_helper"].used_by == ("tenstorrent",)
    assert modules["ice"].refcnt == 2
    assert modules["ice"].used_by == ("irdma", "ice_swx")
    assert modules["nvme_core"].state == "Loading"


def test_parses_modules_builtin_to_kernel_names() -> None:
    text = "kernel/drivers/i2c/i2c-core.ko\nkernel/fs/ext4/ext4.ko\n\n"
    assert parse_modules_builtin(text) == frozenset({"i2c_core", "ext4"})


ORDER = ("tt_helper", "tenstorrent")


def test_load_decisions() -> None:
    fine = {"tt_helper": live("tt_helper"), "tenstorrent": live("tenstorrent", version="2.9.0")}
    assert decide_load(ORDER, fine, "2.9.0").action is LoadAction.NOTHING
    assert decide_load(ORDER, fine, None).action is LoadAction.NOTHING

    stale = {**fine, "tenstorrent": live("tenstorrent", version="2.8.0")}
    decision = decide_load(ORDER, stale, "2.9.0")
    assert decision.action is LoadAction.REPLACE
    assert decision.unload_first == ("tenstorrent", "tt_helper")

    half = {**fine, "tenstorrent": absent("tenstorrent")}
    assert decide_load(ORDER, half, "2.9.0").action is LoadAction.LOAD

    coming = {**fine, "tt_helper": ModuleObservation("tt_helper", Presence.LOADED, "coming")}
    assert decide_load(ORDER, coming, None).action is LoadAction.REPLACE

    builtin = {**fine, "tt_helper": ModuleObservation("tt_helper", Presence.BUILTIN)}
    assert decide_load(ORDER, builtin, None).action is LoadAction.BLOCKED

    in_tree = {**fine, "tenstorrent": live("tenstorrent", out_of_tree=False)}
    assert decide_load(ORDER, in_tree, None).action is LoadAction.NOTHING
    replacing = decide_load(ORDER, in_tree, None, frozenset({"tenstorrent"}))
    assert replacing.action is LoadAction.REPLACE


def test_unload_assessment_separates_module_users_from_open_files() -> None:
    observed = {
        "tenstorrent": live("tenstorrent", refcnt=3, used_by=("tt_extra",)),
        "tt_helper": live("tt_helper", refcnt=1, used_by=("tenstorrent",)),
    }
    assessment = assess_unload(("tenstorrent", "tt_helper"), observed)
    assert assessment.loaded == ("tenstorrent", "tt_helper")
    assert assessment.foreign_users == {"tenstorrent": ("tt_extra",)}
    assert assessment.process_refs == {"tenstorrent": 2}
    assert assessment.busy


module_names = st.sampled_from([f"m{i}" for i in range(7)])


@st.composite
def dependency_forests(draw: st.DrawFn) -> dict[str, ModuleObservation]:
    """Loaded modules where each may use modules with a lower index (no cycles)."""
    names = sorted(draw(st.sets(module_names, min_size=1)), key=lambda n: int(n[1:]))
    uses = {n: [d for d in names[:i] if draw(st.booleans())] for i, n in enumerate(names)}
    users = {n: tuple(u for u in names if n in uses[u]) for n in names}
    return {n: live(n, refcnt=len(users[n]), used_by=users[n]) for n in names}


@given(dependency_forests(), st.data())
def test_in_tree_removal_never_removes_a_module_before_its_users(
    observed: dict[str, ModuleObservation], data: st.DataObject
) -> None:
    listed = data.draw(st.permutations(sorted(observed)))
    removal = plan_in_tree_removal(listed, observed)
    assert sorted(removal.remove) == sorted(observed)
    position = {n: i for i, n in enumerate(removal.remove)}
    for name, seen in observed.items():
        assert all(position[user] < position[name] for user in seen.used_by)


@given(dependency_forests())
def test_a_whole_forest_with_no_open_files_is_never_busy(
    observed: dict[str, ModuleObservation],
) -> None:
    order = plan_in_tree_removal(sorted(observed), observed).remove
    assert not assess_unload(order, observed).busy
