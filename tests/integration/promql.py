"""The PromQL the chart ships (its alerts and its Grafana dashboard), and the metric
names an expression reads."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tests.integration.helm import Helm

# Series Prometheus makes itself, not the operator.
PROMETHEUS_SERIES = frozenset({"up"})

_KEYWORDS = frozenset({"and", "or", "unless", "bool", "inf", "nan"})
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSETS = re.compile(r"\boffset\s+-?\w+")
_GRAFANA_VARIABLES = re.compile(r"\$\{?\w+\}?")
# An identifier not inside a number (1e3) and not a function or aggregation (a call).
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: what is left once label matchers, strings,
    ranges, label lists (by, on, group_left, …), calls and keywords are taken out."""
    text = expr
    for pattern in (_STRINGS, _MATCHERS, _RANGES, _LABEL_LISTS, _OFFSETS, _GRAFANA_VARIABLES):
        text = pattern.sub(" ", text)
    return {
        m.group(1)
        for m in _IDENTIFIER.finditer(text)
        if m.group(2) is None and m.group(1).lower() not in _KEYWORDS
    }


@dataclass(frozen=True)
class ChartQueries:
    rules: list[dict[str, Any]]
    """The PrometheusRule's rules, as rendered."""
    dashboard: dict[str, Any]
    """The Grafana dashboard, as the ConfigMap carries it."""

    @property
    def panel_exprs(self) -> list[str]:
        return [t["expr"] for p in self.dashboard["panels"] for t in p.get("targets", [])]

    @property
    def variable_queries(self) -> list[str]:
        """The selectors the dashboard's variables take label values from."""
        found = []
        for v in self.dashboard["templating"]["list"]:
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            if m := re.fullmatch(r"label_values\((.*),\s*\w+\)", query):
                found.append(m.group(1))
        return found

    def exprs(self) -> list[str]:
        return [r["expr"] for r in self.rules] + self.panel_exprs + self.variable_queries


def chart_queries(helm: Helm, *sets: str) -> ChartQueries:
    docs = helm.template(
        "--set", "metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true", *sets
    )
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    [dashboard] = [d for d in docs if d["kind"] == "ConfigMap" and "kmodkit.json" in d["data"]]
    return ChartQueries(
        [r for g in rule["spec"]["groups"] for r in g["rules"]],
        json.loads(dashboard["data"]["kmodkit.json"]),
    )
