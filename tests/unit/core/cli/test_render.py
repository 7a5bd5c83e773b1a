"""`kmodkit render`: the objects the operator would create, computed offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kmodkit.core.cli.main import main
from kmodkit.core.cli.render import RenderError, nodes_from, render

K1, K2 = "6.8.0-45-generic", "7.0.0-14-generic"


def module() -> dict[str, Any]:
    return {
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": "xe", "namespace": "drivers"},
        "spec": {
            "selector": {"gpu": "intel"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "xe"},
                    "kernelMappings": [
                        {
                            "regexp": r"^(6\.8|7\.0)\.",
                            "containerImage": "r.io/xe:${KERNEL_FULL_VERSION}",
                            "build": {"dockerfileConfigMap": {"name": "df"}},
                        }
                    ],
                }
            },
        },
    }


def node(name: str, kernel: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"nodeInfo": {"kernelVersion": kernel, "architecture": "amd64"}},
    }


NODES = [node("a", K1, gpu="intel"), node("b", K2, gpu="intel"), node("c", K1, gpu="amd")]


def test_a_module_renders_one_loader_pod_per_selected_node() -> None:
    objs = render(module(), nodes_from(NODES), "kmodkit-system")
    assert [(o["kind"], o["spec"]["nodeName"]) for o in objs] == [("Pod", "a"), ("Pod", "b")]
    assert objs[1]["spec"]["initContainers"][0]["image"] == f"r.io/xe:{K2}"


def test_missing_images_render_one_build_job_per_image() -> None:
    objs = render(module(), nodes_from(NODES), "kmodkit-system", images_missing=True)
    assert sorted(o["metadata"]["annotations"]["kmodkit.io/image"] for o in objs) == [
        f"r.io/xe:{K1}",
        f"r.io/xe:{K2}",
    ]
    assert {o["kind"] for o in objs} == {"Job"}


def test_nodes_from_a_list_and_bad_documents() -> None:
    assert [n.name for n in nodes_from([{"kind": "List", "items": NODES}])] == ["a", "b", "c"]
    with pytest.raises(RenderError, match="takes Node objects"):
        nodes_from([module()])
    with pytest.raises(RenderError, match="no installed backend serves"):
        render({"apiVersion": "example.com/v1", "kind": "Gizmo"}, [], "ns")


def test_cli_prints_json_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    mod, nodes = tmp_path / "m.yaml", tmp_path / "n.yaml"
    mod.write_text(yaml.safe_dump(module()))
    nodes.write_text(yaml.safe_dump_all(NODES))
    out = CliRunner().invoke(main, ["render", "-f", str(mod), "--nodes", str(nodes), "-o", "json"])
    assert out.exit_code == 0, out.output
    assert [o["metadata"]["name"] for o in json.loads(out.output)] == ["xe-loader-a", "xe-loader-b"]
    bad = CliRunner().invoke(main, ["render", "-f", str(mod), "--nodes", str(mod)])
    assert bad.exit_code == 2 and "takes Node objects" in bad.output
