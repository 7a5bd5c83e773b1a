"""Every Dockerfile under dockerfiles/: parses, pinned bases, a real entrypoint.

No image is built here (no container engine is needed); these are the checks
that keep a release reproducible and its images runnable.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted((ROOT / "dockerfiles").glob("**/Dockerfile"))
INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK",
    "LABEL", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip
# A tag that names a release: it has a digit and is not a moving alias.
FLOATING = re.compile(r"^(latest|stable|edge|nightly|rolling|devel|[a-z]+)$")


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse(path: Path) -> list[Instruction]:
    """Instructions with continuations joined; fails on anything Docker would not accept."""
    out: list[Instruction] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if pending is None and (not line or line.startswith("#")):
            continue
        if pending is not None and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        start, text = pending if pending is not None else (number, "")
        text = f"{text} {line}".strip()
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        keyword, _, args = text.partition(" ")
        assert keyword.upper() in INSTRUCTIONS, f"{path}:{start}: unknown instruction {keyword}"
        out.append(Instruction(start, keyword.upper(), args.strip()))
    assert pending is None, f"{path}: ends inside a line continuation"
    assert out and out[0].keyword in ("FROM", "ARG"), f"{path}: must start with FROM or ARG"
    return out


def _base_images(path: Path, instructions: list[Instruction]) -> list[tuple[int, str]]:
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases = []
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args and not stages:
            name, _, default = ins.args.partition("=")
            args[name.strip()] = default.strip().strip("\"'")
        if ins.keyword != "FROM":
            continue
        words = [w for w in ins.args.split() if not w.startswith("--")]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
        if len(words) == 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
        if image.lower() in stages or image == "scratch":
            continue
        bases.append((ins.line, image))
    return bases


def _scripts() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project["scripts"])


def test_there_are_dockerfiles() -> None:
    names = {p.parent.name for p in DOCKERFILES}
    assert {"operator", "agent"} <= names


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfile_bases_are_pinned(path: Path) -> None:
    bases = _base_images(path, parse(path))
    assert bases, f"{path}: no base image"
    for line, image in bases:
        where = f"{path.relative_to(ROOT)}:{line}: FROM {image}"
        assert "$" not in image, f"{where}: an ARG without a default decides the base"
        name, _, digest = image.partition("@")
        last = name.rsplit("/", 1)[-1]
        tag = last.partition(":")[2]
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{where}: malformed digest"
            continue
        assert tag, f"{where}: no tag; pin an exact version or a digest"
        assert not FLOATING.match(tag) and re.search(r"\d", tag), (
            f"{where}: '{tag}' moves over time; pin an exact version or a digest"
        )


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfile_entrypoint_exists(path: Path) -> None:
    instructions = parse(path)
    final = instructions[max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM") :]
    entrypoints = [ins for ins in final if ins.keyword == "ENTRYPOINT"]
    if not entrypoints:
        return  # a content-only image (a driver image the loader copies from)
    ins = entrypoints[-1]
    where = f"{path.relative_to(ROOT)}:{ins.line}"
    try:
        argv = json.loads(ins.args)
    except json.JSONDecodeError:
        pytest.fail(f"{where}: use the exec form (a JSON array) so signals reach the program")
    assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv), where
    program = argv[0]
    if "/" not in program:
        assert program in _scripts(), (
            f"{where}: {program} is not a console script of this package (pyproject.toml)"
        )
    else:
        copied = [ins.args.split()[-1] for ins in final if ins.keyword in ("COPY", "ADD")]
        placed = any(
            program == dest or program.startswith(dest.rstrip("/") + "/") for dest in copied
        )
        assert placed, f"{where}: nothing in the image puts {program} there"


@pytest.mark.parametrize("name", ["operator", "agent", "signer"])
def test_our_images_are_lean_and_least_privileged(name: str) -> None:
    path = ROOT / "dockerfiles" / name / "Dockerfile"
    instructions = parse(path)
    stages = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    assert len(stages) >= 2, f"{path}: build wheels in a stage of their own"
    final = instructions[stages[-1] :]
    text = " ".join(ins.args for ins in final if ins.keyword == "RUN")
    assert "--no-cache-dir" in text
    if "apt-get install" in text:
        assert "--no-install-recommends" in text and "rm -rf /var/lib/apt/lists" in text
    users = [ins.args for ins in final if ins.keyword == "USER"]
    if name == "agent":
        # Loading modules needs root; the agent image carries the kmod tools.
        assert re.search(r"\bkmod\b", text), "the agent image lacks the kmod tools"
    else:
        assert users and users[-1].split(":")[0] not in ("0", "root"), f"{name} runs as root"
    if name == "signer":
        # sign-file is in Debian's linux-kbuild; signing needs no privilege.
        assert re.search(r"\blinux-kbuild-[0-9.]+\b", text), "the signer image lacks sign-file"


# What each image built from this repository may take from it: the operator the
# product, the agent (and the Tenstorrent builder, which runs it) the agent's own
# distribution alone. Never the dev harness, its Go modules or the tests.
IMAGE_SOURCES = {
    "operator": {"pyproject.toml", "README.md", "kmodkit"},
    "agent": {"agent/pyproject.toml", "kmodkit/agent"},
    "signer": {"pyproject.toml", "README.md", "kmodkit"},
    "tenstorrent/builder": {
        "agent/pyproject.toml",
        "kmodkit/agent",
        "dockerfiles/tenstorrent/builder/tt-builder",
        "dockerfiles/tenstorrent/builder/build-tt-kmd",
    },
}


@pytest.mark.parametrize("name", sorted(IMAGE_SOURCES))
def test_images_take_only_their_own_sources(name: str) -> None:
    path = ROOT / "dockerfiles" / name / "Dockerfile"
    copied = set()
    for ins in parse(path):
        if ins.keyword not in ("COPY", "ADD"):
            continue
        words = [w for w in ins.args.split() if not w.startswith("--")]
        if any(w.startswith("--from") for w in ins.args.split()):
            continue  # from another stage, not from the repository
        copied |= set(words[:-1])
    assert copied == IMAGE_SOURCES[name], f"{path.relative_to(ROOT)} copies {sorted(copied)}"


# The user-facing Intel example is built in-cluster from a ConfigMap, not by kmodkit_dev.
NOT_BUILT_HERE = {"intel-xe"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_base_is_the_base_image_argument(path: Path) -> None:
    """A user's build (and kmodkit_dev's, from the mmdebstrap base) picks the base."""
    instructions = parse(path)
    first = next(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    declared = [ins.args for ins in instructions[:first] if ins.keyword == "ARG"]
    assert any(a.startswith("BASE_IMAGE=") for a in declared), f"{path}: no ARG BASE_IMAGE=..."
    stages: set[str] = set()
    for ins in instructions:
        if ins.keyword != "FROM":
            continue
        words = [w for w in ins.args.split() if not w.startswith("--")]
        assert words[0] in stages or words[0] == "${BASE_IMAGE}", f"{path}:{ins.line}"
        if len(words) == 3:
            stages.add(words[2])


def test_every_dockerfile_is_in_the_image_table() -> None:
    from kmodkit_dev import images

    table = {spec.dockerfile for spec in images.IMAGES.values()}
    expected = {p for p in DOCKERFILES if p.parent.name not in NOT_BUILT_HERE}
    assert table == expected


@pytest.mark.parametrize("name", ["tenstorrent/builder", "tenstorrent/flasher"])
def test_downloads_are_build_arguments(name: str) -> None:
    """What comes from GitHub is named by build arguments, so a build can take it elsewhere."""
    path = ROOT / "dockerfiles" / name / "Dockerfile"
    for ins in parse(path):
        if ins.keyword == "RUN":
            assert "://" not in ins.args, f"{path}:{ins.line}: a URL in a RUN step"
