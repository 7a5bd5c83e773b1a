"""The chart's PrometheusRule and Grafana dashboard, checked by Prometheus' own promtool.

The rules are rendered by the real helm; ``promtool check rules`` parses their
PromQL and annotation templates, and ``promtool test rules`` feeds them the
synthetic series of ``promtool/kmodkit_rules_test.yaml``. That the metrics they
read are the operator's is checked against the live operator in test_rbac.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kmodkit.core.rollout.states import State
from kmodkit_dev import build
from tests.integration.helm import Helm
from tests.integration.promql import chart_queries, metric_names

RULES_TEST = Path(__file__).parent / "promtool" / "kmodkit_rules_test.yaml"
ANNOTATIONS_TEST = RULES_TEST.with_name("kmodkit_annotations_test.yaml")
FINISHED = {State.DONE.value, State.FAILED.value}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    build.ensure(["promtool"])
    return subprocess.run(
        [str(build.binary("promtool")), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _rules_file(path: Path, rules: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"groups": [{"name": "kmodkit", "rules": rules}]}))
    return path


def test_the_rules_pass_promtool_check(each_helm: Helm, tmp_path: Path) -> None:
    rules = chart_queries(each_helm).rules
    assert {r["alert"] for r in rules} == {
        "KmodkitRolloutStuck",
        "KmodkitNodeFailed",
        "KmodkitDegraded",
        "KmodkitBuildsFailing",
        "KmodkitNotReconciling",
        "KmodkitOperatorDown",
    }
    out = _promtool(
        "check", "rules", str(_rules_file(tmp_path / "rules.yaml", rules)), cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout


def test_each_alert_fires_when_it_should_and_not_when_all_is_well(
    helm: Helm, tmp_path: Path
) -> None:
    # Annotations are left out: promtool would compare their every word.
    rules = [{k: v for k, v in r.items() if k != "annotations"} for r in chart_queries(helm).rules]
    _rules_file(tmp_path / "kmodkit_rules.yaml", rules)
    shutil.copy(RULES_TEST, tmp_path)
    out = _promtool("test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_annotations_fill_in_the_alerts_labels_and_value(helm: Helm, tmp_path: Path) -> None:
    _rules_file(tmp_path / "kmodkit_rules_with_annotations.yaml", chart_queries(helm).rules)
    shutil.copy(ANNOTATIONS_TEST, tmp_path)
    out = _promtool("test", "rules", ANNOTATIONS_TEST.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_thresholds_and_labels_reach_the_rules(helm: Helm) -> None:
    rules = {
        r["alert"]: r
        for r in chart_queries(
            helm,
            "--set", "metrics.prometheusRule.rolloutStuckMinutes=10",
            "--set", "metrics.prometheusRule.notReconcilingMinutes=20",
            "--set", "metrics.prometheusRule.buildFailures=5",
            "--set", "metrics.prometheusRule.buildFailureWindow=30m",
            "--set", "metrics.prometheusRule.pendingFor=2m",
        ).rules
    }  # fmt: skip
    assert re.search(r"\) > 600\b", rules["KmodkitRolloutStuck"]["expr"])
    assert re.search(r"> 1200\b", rules["KmodkitNotReconciling"]["expr"])
    assert re.search(r"\[30m\]\)\s*\)\s*>= 5\b", rules["KmodkitBuildsFailing"]["expr"])
    for alert in ("KmodkitNodeFailed", "KmodkitDegraded", "KmodkitOperatorDown"):
        assert rules[alert]["for"] == "2m"


def test_the_prometheus_rule_carries_its_labels_and_is_off_by_default(helm: Helm) -> None:
    docs = helm.template()
    assert not [d for d in docs if d["kind"] == "PrometheusRule"]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]
    on = helm.template(
        "--set", "metrics.prometheusRule.enabled=true,metrics.prometheusRule.labels.release=prom",
        "--set", "metrics.dashboard.enabled=true",
    )  # fmt: skip
    [rule] = [d for d in on if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    [dashboard] = [d for d in on if d["metadata"]["name"] == "kmodkit-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    # Without metrics there is nothing to alert on or to show.
    off = helm.template(
        "--set", "metrics.enabled=false,metrics.prometheusRule.enabled=true",
        "--set", "metrics.dashboard.enabled=true",
    )  # fmt: skip
    assert not [d for d in off if d["kind"] in ("PrometheusRule", "ConfigMap")]


def test_the_dashboard_queries_are_valid_promql(helm: Helm, tmp_path: Path) -> None:
    queries = chart_queries(helm)
    titles = {p["title"] for p in queries.dashboard["panels"]}
    assert {"Nodes by state", "Rollout progress", "Reconcile latency", "API errors"} <= titles
    # Grafana's variables as Grafana would fill them in, then each query as a recording rule.
    filled = [
        e.replace("$__rate_interval", "5m").replace("$controller", ".*").replace("$policy", ".*")
        for e in [*queries.panel_exprs, *queries.variable_queries]
    ]
    assert not [e for e in filled if "$" in e]
    rules = [{"record": f"kmodkit:dashboard:{i}", "expr": e} for i, e in enumerate(filled)]
    out = _promtool("check", "rules", str(_rules_file(tmp_path / "q.yaml", rules)), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rollout_states_in_the_queries_are_the_rollouts_own(helm: Helm) -> None:
    queries = chart_queries(helm)
    unfinished = {s.value for s in State} - FINISHED

    def states(expr: str) -> set[str]:
        [regex] = re.findall(r'kmodkit_nodes\{[^}]*state=~"([^"]+)"', expr)
        return set(regex.split("|"))

    [stuck] = [r["expr"] for r in queries.rules if r["alert"] == "KmodkitRolloutStuck"]
    assert states(stuck) == unfinished
    [progress] = [p for p in queries.dashboard["panels"] if p["title"] == "Rollout progress"]
    assert states(progress["targets"][0]["expr"]) == unfinished | FINISHED


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (state) (kmodkit_nodes{controller=~"$controller", policy="a/b"})',
            {"kmodkit_nodes"},
        ),
        (
            "histogram_quantile(0.95, sum by (controller, le) "
            "(rate(kmodkit_reconcile_duration_seconds_bucket[$__rate_interval])))",
            {"kmodkit_reconcile_duration_seconds_bucket"},
        ),
        (
            "(time() - a_timestamp_seconds) > 1e3 and on (controller, policy) b == 0 "
            "unless ignoring(x) c offset 5m or bool_flag * 2",
            {"a_timestamp_seconds", "b", "c", "bool_flag"},
        ),
        ('absent(up{job="x"} == 1)', {"up"}),
        ("x / on (a) group_left(b, c) y", {"x", "y"}),
        ("max_over_time(m[10m:1m])", {"m"}),
    ],
)
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
