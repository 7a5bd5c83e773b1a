"""The offline commands: validate and preflight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner, Result

from kmodkit.core.cli.main import main
from tests.unit.examples import kmm_example, kmodkit_example, minimal

KERNELS = ["6.8.0-45-generic", "6.12.0-55.el9_5.x86_64+", "5.14.0-284.el9.x86_64"]


def _write(tmp_path: Path, *docs: Any) -> str:
    path = tmp_path / "module.yaml"
    path.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return str(path)


def _run(*args: str, stdin: str | None = None) -> Result:
    # A wide terminal, so table cells are not wrapped.
    return CliRunner().invoke(main, list(args), input=stdin, env={"COLUMNS": "200"})


def test_validate_accepts_kmodkit_and_kmm_modules(tmp_path: Path) -> None:
    result = _run("validate", "-f", _write(tmp_path, kmodkit_example(), None, kmm_example()))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_validate_prints_one_line_per_problem(tmp_path: Path) -> None:
    bad = minimal(containerImage="registry:5000/mod")
    bad["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["regexp"] = "(a)\\1"
    filename = _write(tmp_path, minimal(), bad)
    result = _run("validate", "-f", filename)
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        f"{filename}: Module/mod: spec.moduleLoader.container.containerImage: 'registry:5000/mod' "
        "has no tag or digest, so it would pull registry:5000/mod:latest; add one, e.g. "
        "registry:5000/mod:${KERNEL_FULL_VERSION}",
        f"{filename}: Module/mod: spec.moduleLoader.container.kernelMappings[0].regexp: uses "
        "\\1, a backreference, which RE2 does not support; match the text explicitly instead "
        "(write \\x.. for a character code)",
    ]


def test_validate_fills_in_the_namespace(tmp_path: Path) -> None:
    body = minimal()
    body["metadata"] = {"name": "m" * 30}
    filename = _write(tmp_path, body)
    assert _run("validate", "-f", filename, "-n", "n" * 11).exit_code == 0
    result = _run("validate", "-f", filename, "-n", "n" * 12)
    assert result.exit_code == 2
    assert ": metadata.name: together with metadata.namespace" in result.stdout


def test_validate_reports_unknown_kinds_and_bad_yaml(tmp_path: Path) -> None:
    result = _run("validate", "-f", _write(tmp_path, {"apiVersion": "v1", "kind": "Pod"}))
    assert result.exit_code == 2
    assert "Pod/(document 1): apiVersion: v1 Pod is not a kind kmodkit validates" in result.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [", encoding="utf-8")
    result = _run("validate", "-f", str(broken))
    assert result.exit_code == 2
    assert "cannot read YAML" in result.stderr


def test_validate_reads_stdin() -> None:
    assert _run("validate", "-f", "-", stdin=yaml.safe_dump(minimal())).exit_code == 0


def _preflight(tmp_path: Path, body: dict[str, Any], *kernels: str) -> Result:
    args = ["preflight", "-f", _write(tmp_path, body), "-o", "json"]
    for kernel in kernels:
        args += ["--kernel", kernel]
    return _run(*args)


def test_preflight_json(tmp_path: Path) -> None:
    result = _preflight(tmp_path, kmodkit_example(), *KERNELS)
    assert result.exit_code == 1
    assert json.loads(result.stdout) == [
        {
            "kernel": "6.8.0-45-generic",
            "matched": True,
            "mappingIndex": 0,
            "containerImage": "registry.example.com:5000/drivers/xe:6.8.0-45-generic",
            "build": True,
            "error": None,
        },
        {
            "kernel": "6.12.0-55.el9_5.x86_64+",
            "matched": True,
            "mappingIndex": 1,
            "containerImage": "registry.example.com/drivers/xe-el9:6.12",
            "build": True,
            "error": None,
        },
        {
            "kernel": "5.14.0-284.el9.x86_64",
            "matched": False,
            "mappingIndex": None,
            "containerImage": None,
            "build": False,
            "error": None,
        },
    ]


def test_preflight_exits_0_when_every_kernel_matches(tmp_path: Path) -> None:
    assert _preflight(tmp_path, kmodkit_example(), *KERNELS[:2]).exit_code == 0


def test_preflight_reports_resolution_errors(tmp_path: Path) -> None:
    body = minimal()
    body["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["containerImage"] = (
        "q.io/m:$KERNEL_Z"
    )
    result = _preflight(tmp_path, body, "6.8")
    assert result.exit_code == 1
    (entry,) = json.loads(result.stdout)
    assert entry["matched"] is True
    assert entry["mappingIndex"] == 0
    assert entry["containerImage"] is None
    assert "kernelMappings[0].containerImage" in entry["error"]


def test_preflight_refuses_invalid_modules(tmp_path: Path) -> None:
    result = _preflight(tmp_path, minimal(containerImage="registry:5000/mod"), "6.8.0")
    assert result.exit_code == 2
    assert "spec.moduleLoader.container.containerImage" in result.stderr


def test_preflight_needs_exactly_one_module(tmp_path: Path) -> None:
    filename = _write(tmp_path, minimal(), minimal())
    result = _run("preflight", "-f", filename, "--kernel", "6.8.0")
    assert result.exit_code == 2
    assert "holds 2 Modules" in result.stderr


def test_preflight_text_table(tmp_path: Path) -> None:
    result = _run(
        "preflight",
        "-f",
        _write(tmp_path, kmodkit_example()),
        *[arg for kernel in KERNELS for arg in ("--kernel", kernel)],
    )
    assert result.exit_code == 1
    assert "Module drivers/xe" in result.stdout
    assert "no mapping matches" in result.stdout
