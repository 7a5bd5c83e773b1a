"""``make bench``: speed and memory of the engine, measured (never asserted in tests).

0. One reconcile pass of each backend resource (Tenstorrent driver and firmware policies,
   Intel's ClusterPolicy) over a large fleet, in operator CPU, without a cluster
   (tests/bench/passes.py).
1. The pure loader plan over a large fleet: time per pass and peak memory.
2. For each fleet size, a fresh devcluster of kwok nodes and, in the same run:
   the raw apiserver baseline (the writes any controller must make, done directly:
   tests/bench/baseline.py), once with minimal pods and once with the operator's loader
   pods, then the real operator (``kmodkit run``): time from
   applying a Module until every node is labelled ready and its ratio to the
   baseline, the time to the first ready node, peak RSS, its writes per node from
   the apiserver's audit log, writes per minute once converged, a SIGKILL and
   restart (time to the first full pass, and its writes), 50 nodes joining
   one at a time (time until each has its loader pod, p99), and a Module update
   rolled across the fleet within maxUnavailable (its time against the bound the
   budget sets, BENCH_ROLLOUT_MAX_UNAVAILABLE and BENCH_ROLLOUT_SWAP_SECONDS) on
   fleets of up to BENCH_ROLLOUT_MAX_NODES (default 1000).

3. Each backend's policy on a fresh devcluster of BENCH_BACKEND_NODES kwok nodes (default
   1000, 0 skips it) with the real operator: a TenstorrentDriverPolicy, a
   TenstorrentFirmwarePolicy and an Intel ClusterPolicy, one after the other: the time to
   converge, the operator's CPU and peak RSS, its writes and its writes at rest, and its
   writes after a restart (tests/bench/backends.py); BENCH_BACKENDS picks some of them
   (driver, firmware, intel).

Sizes are settings: BENCH_PASS_NODES (default 1000), BENCH_PLAN_NODES (default
10000), BENCH_SIZES (comma separated, default 300,1000) and BENCH_BACKEND_NODES. Every
figure is printed as a JSON line, then the tables. ``--docs`` writes the tables and the
plot into docs/performance.md and docs/performance.svg.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus, plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.nodes import NodeView
from kmodkit_dev.nodes import KERNELS
from tests.bench import backends, passes, report
from tests.bench.fleet import Figures, Fleet, module_body

DOCS = Path(__file__).resolve().parents[2] / "docs"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
BACKENDS_BEGIN, BACKENDS_END = "<!-- bench-backends:begin -->", "<!-- bench-backends:end -->"


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def bench_passes(n: int) -> None:
    for figures in passes.measure(n):
        emit(**figures)


def bench_plan(n: int) -> None:
    module = Module.model_validate(module_body("r.io/bench:${KERNEL_FULL_VERSION}"))
    nodes = [
        NodeView(f"node-{i:05d}", {"bench": "yes"}, KERNELS[i % 3], "amd64", True) for i in range(n)
    ]
    settings = LoaderSettings(agent_image="r.io/agent:1")
    images = {f"r.io/bench:{k}": ImageStatus(ImageState.EXISTS) for k in KERNELS}
    tracemalloc.start()
    started = time.perf_counter()
    first = plan(module, nodes, [], images, settings)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    emit(
        bench="loader_plan",
        nodes=n,
        seconds=round(elapsed, 3),
        peak_mib=round(peak / 2**20, 1),
        pods_planned=len(first.create),
    )


def bench_fleet(n: int) -> Figures:
    fleet = Fleet(n)
    try:
        figures = fleet.measure()
    finally:
        fleet.close()
    emit(
        bench="fleet",
        ratio=round(figures.ratio, 2),
        loader_ratio=round(figures.loader_ratio, 2),
        **dataclasses.asdict(figures),
    )
    return figures


def bench_backends(n: int) -> str:
    rows, restart = backends.measure(n)
    for figures in rows:
        emit(bench="backend", **dataclasses.asdict(figures))
    emit(bench="backends_restart", nodes=n, writes=restart)
    return backends.table(rows, restart)


def _replace(text: str, begin: str, end: str, body: str) -> str:
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + f"{begin}\n{body}\n{end}" + text[stop:]


def write_docs(rows: list[Figures], backend_table: str | None) -> None:
    page = DOCS / "performance.md"
    text = page.read_text()
    day = time.strftime("%Y-%m-%d")
    if rows:
        text = _replace(
            text,
            BEGIN,
            END,
            f"Measured {day} by `make bench` (with `--docs`) "
            f"(`BENCH_SIZES={','.join(str(f.nodes) for f in rows)}`), one run, "
            f"{os.cpu_count()} cores:\n\n{report.table(rows)}\n\n"
            f"The operator's writes by resource during convergence (audit log):\n\n"
            f"{report.writes_table(rows)}\n\n"
            "![time and memory against fleet size](performance.svg)",
        )
        (DOCS / "performance.svg").write_text(report.svg(rows))
    if backend_table is not None:
        text = _replace(
            text,
            BACKENDS_BEGIN,
            BACKENDS_END,
            f"Measured {day} by `make bench` (with `--docs`), {os.cpu_count()} cores:\n\n"
            f"{backend_table}",
        )
    page.write_text(text)


def main() -> None:
    bench_passes(int(os.environ.get("BENCH_PASS_NODES", str(passes.DEFAULT_NODES))))
    bench_plan(int(os.environ.get("BENCH_PLAN_NODES", "10000")))
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "300,1000").split(",") if s]
    rows = [bench_fleet(n) for n in sizes]
    backend_nodes = int(os.environ.get("BENCH_BACKEND_NODES", str(backends.DEFAULT_NODES)))
    backend_table = bench_backends(backend_nodes) if backend_nodes else None
    if rows:
        print(report.table(rows))
    if backend_table is not None:
        print(backend_table)
    if "--docs" in sys.argv[1:]:
        write_docs(rows, backend_table)


if __name__ == "__main__":
    main()
