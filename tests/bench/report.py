"""The benchmark's figures as a table and a plot (SVG, no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tests.bench.fleet import Figures


def table(rows: Sequence[Figures]) -> str:
    head = (
        "| nodes | raw baseline | kmodkit converges | ratio (goal ≤ 1.5) "
        "| raw baseline, loader pods | ratio to it | CPU while converging: operator, apiserver "
        "| first node ready "
        "| peak RSS (≤ 250 MiB) | writes/node (≤ 3) | idle writes/min (0) "
        "| restart to first pass (≤ 10 s) | writes in restart (0) | join p99 (≤ 2 s) "
        "| rollout | rollout bound | rollout ratio (≤ 1.2) | rollout writes/node |"
    )
    lines = [head, "|" + "---|" * 18]
    for f in rows:
        lines.append(
            f"| {f.nodes:,} | {f.baseline_s:.1f} s | {f.converge_s:.1f} s | {f.ratio:.2f}x "
            f"| {f.loader_baseline_s:.1f} s | {f.loader_ratio:.2f}x "
            f"| {f.converge_cpu_s:.0f} s, {f.converge_apiserver_cpu_s:.0f} s "
            f"| {f.first_ready_s:.1f} s | {f.peak_rss_mib:.0f} MiB | {f.writes_per_node:.2f} "
            f"| {f.idle_writes_per_min:.0f} | {f.restart_s:.1f} s | {f.restart_writes} "
            f"| {f.join_p99_s:.2f} s | {_rollout(f)} |"
        )
    return "\n".join(lines)


def _rollout(f: Figures) -> str:
    """The rollout's cells: its time, its bound (with the budget and swap time that set
    it), their ratio, and the operator's writes per node it rolled."""
    if not f.rollout_nodes:
        return " | | | "
    waves = math.ceil(f.rollout_nodes / f.rollout_max_unavailable)
    bound = (
        f"{f.rollout_bound_s:g} s (maxUnavailable {f.rollout_max_unavailable}: "
        f"{waves} x {f.rollout_swap_s:g} s)"
    )
    writes = sum(f.rollout_writes.values()) / f.rollout_nodes
    return f"{f.rollout_s:.1f} s | {bound} | {f.rollout_ratio:.2f}x | {writes:.2f}"


def writes_table(rows: Sequence[Figures]) -> str:
    kinds = sorted({k for f in rows for k in f.writes})
    lines = ["| nodes | " + " | ".join(kinds) + " |", "|" + "---|" * (len(kinds) + 1)]
    for f in rows:
        lines.append(
            f"| {f.nodes:,} | " + " | ".join(str(f.writes.get(k, 0)) for k in kinds) + " |"
        )
    return "\n".join(lines)


def _chart(
    title: str, unit: str, series: dict[str, list[tuple[int, float]]], x0: int, y0: int
) -> list[str]:
    """One log-x line chart, 360 by 220, at (x0, y0)."""
    w, h, pad = 360, 220, 44
    xs = sorted({x for points in series.values() for x, _ in points})
    top = max((y for points in series.values() for _, y in points), default=1.0) * 1.1 or 1.0
    lo, hi = math.log10(xs[0]), math.log10(xs[-1]) if len(xs) > 1 else math.log10(xs[0]) + 1

    def px(x: int) -> float:
        return x0 + pad + (math.log10(x) - lo) / (hi - lo or 1) * (w - 2 * pad)

    def py(y: float) -> float:
        return y0 + h - pad + -(y / top) * (h - 2 * pad)

    out = [
        f'<text x="{x0 + w / 2}" y="{y0 + 16}" text-anchor="middle" font-size="13">{title}</text>',
        f'<line x1="{x0 + pad}" y1="{py(0)}" x2="{x0 + w - pad}" y2="{py(0)}" stroke="#444"/>',
        f'<line x1="{x0 + pad}" y1="{py(0)}" x2="{x0 + pad}" y2="{py(top)}" stroke="#444"/>',
        f'<text x="{x0 + 4}" y="{py(top) - 6}" font-size="10">{unit}</text>',
    ]
    for x in xs:
        out.append(
            f'<text x="{px(x)}" y="{py(0) + 14}" text-anchor="middle" font-size="10">{x:,}</text>'
        )
    for frac in (0.5, 1.0):
        y = top / 1.1 * frac
        out.append(f'<text x="{x0 + pad - 4}" y="{py(y) + 3}" text-anchor="end" font-size="10">'
                   f"{y:.0f}</text>")  # fmt: skip
    colours = ("#1f77b4", "#d62728", "#2ca02c")
    for (name, points), colour in zip(series.items(), colours, strict=False):
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in points:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        n = list(series).index(name)
        out.append(
            f'<text x="{x0 + pad + 8}" y="{y0 + 34 + 13 * n}" font-size="11" fill="{colour}">'
            f"{name}</text>"
        )
    return out


def svg(rows: Sequence[Figures]) -> str:
    rows = sorted(rows, key=lambda f: f.nodes)
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="740" height="240" '
        'font-family="sans-serif">',
        '<rect width="740" height="240" fill="white"/>',
        *_chart(
            "Module applied → every node ready",
            "seconds",
            {
                "raw apiserver baseline": [(f.nodes, f.baseline_s) for f in rows],
                "the same with loader pods": [(f.nodes, f.loader_baseline_s) for f in rows],
                "kmodkit": [(f.nodes, f.converge_s) for f in rows],
            },
            0,
            10,
        ),
        *_chart(
            "Operator peak memory",
            "MiB",
            {"kmodkit peak RSS": [(f.nodes, f.peak_rss_mib) for f in rows]},
            370,
            10,
        ),
        "</svg>",
    ]
    return "\n".join(parts) + "\n"
