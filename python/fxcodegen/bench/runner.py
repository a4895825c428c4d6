"""Time the implementations (:mod:`~fxcodegen.bench.impls`) side by side in one process.

Runs are interleaved (one run of each implementation per round, the order rotating), and the
median is reported, so slow drifts of a shared machine hit every implementation alike. The
cyclic GC stays on, as in real use, but is collected before each run. torch.fx, which no target
compares with, is timed after the others' rounds, in the same process: its ``python_code`` run
on a graph leaves the floor's next read of that graph faster, which would flatter the floor.

:func:`run_shape` makes one row of the table: these timings, the size and ``compile()`` time of
the emitted source, the page costs of :func:`~fxcodegen.bench.host.page_cost_us` around the
runs, and the peak memory of fresh processes (:mod:`~fxcodegen.bench.peak_rss`), the median of
three up to 200k nodes.
"""

from __future__ import annotations

import gc
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.fx as fx

from fxcodegen.bench import workloads
from fxcodegen.bench.host import page_cost_us
from fxcodegen.bench.impls import implementation
from fxcodegen.bench.peak_rss import peak_memory

__all__ = ["APART", "Row", "compile_seconds", "measure", "run_shape"]

APART = ("torch.fx",)
"""Timed in rounds of their own, after the others' (see the module's docstring)."""


def measure(
    gm: fx.GraphModule,
    impls: dict[str, Callable[[fx.GraphModule], Any]],
    repeat: int,
    budget_s: float = 60.0,
    min_time_s: float = 0.0,
    max_rounds: int = 101,
    faults: dict[str, list[int]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per run of each implementation: ``repeat`` interleaved rounds, each one
    dropping implementations whose runs so far exceed ``budget_s`` (at least one run each).
    Rounds go on past ``repeat`` until ``min_time_s`` has passed (at most ``max_rounds``): on
    small graphs a run takes under a millisecond and a median of five is mostly noise.
    ``faults``, when given, gets each run's page faults (all threads of the process): pages it
    wrote that were not resident, the part of its time that fresh memory costs."""
    times: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    start = time.perf_counter()
    r = 0
    while r < repeat or (time.perf_counter() - start < min_time_s and r < max_rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if times[name] and sum(times[name]) > budget_s:
                continue
            fn = impls[name]
            gc.collect()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter_ns()
            result = fn(gm)
            t1 = time.perf_counter_ns()
            f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            del result
            times[name].append((t1 - t0) / 1e9)
            if faults is not None:
                faults.setdefault(name, []).append(f1 - f0)
        r += 1
    return times


def compile_seconds(code: str, repeat: int, budget_s: float = 30.0) -> float:
    """Median CPython ``compile()`` time of ``code``."""
    times: list[float] = []
    for _ in range(repeat):
        if times and sum(times) > budget_s:
            break
        gc.collect()
        t0 = time.perf_counter_ns()
        compile(code, "<bench>", "exec")
        times.append((time.perf_counter_ns() - t0) / 1e9)
    return statistics.median(times)


# --- one row of the table ----------------------------------------------------------------------


@dataclass
class Row:
    shape: str
    size: int
    """The requested size (nodes; layers for the model shape)."""
    nodes: int
    runs: dict[str, int] = field(default_factory=dict)
    median_s: dict[str, float] = field(default_factory=dict)
    ns_per_node: dict[str, float] = field(default_factory=dict)
    pool: dict[str, int] = field(default_factory=dict)
    source_bytes: dict[str, int] = field(default_factory=dict)
    compile_ns_per_node: dict[str, float] = field(default_factory=dict)
    peak_extra_bytes: dict[str, int] = field(default_factory=dict)
    """The median of ``peak_extra_runs``."""
    peak_extra_runs: dict[str, list[int]] = field(default_factory=dict)
    """Peak extra bytes of each fresh process measured."""
    faults_per_run: dict[str, int] = field(default_factory=dict)
    """Median page faults of a timed run (fresh pages written)."""
    page_us: dict[str, dict[str, float] | None] = field(default_factory=dict)
    """What a fresh and a resident page cost ``before`` and ``after`` the timed runs
    (:func:`~fxcodegen.bench.host.page_cost_us`): the machine's price of fresh memory, which drifts."""
    meta: dict[str, Any] = field(default_factory=dict)

    def ratio(self, a: str, b: str) -> float | None:
        if a in self.median_s and b in self.median_s and self.median_s[b] > 0:
            return self.median_s[a] / self.median_s[b]
        return None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratios"] = {
            "reference/fxcodegen": self.ratio("reference", "fxcodegen"),
            "torch.fx/fxcodegen": self.ratio("torch.fx", "fxcodegen"),
            "fxcodegen/floor": self.ratio("fxcodegen", "floor"),
        }
        src = self.source_bytes.get("fxcodegen")
        mem = self.peak_extra_bytes.get("fxcodegen")
        d["ratios"]["peak/source"] = mem / src if src and mem is not None else None
        return d


def run_shape(
    shape: str,
    size: int,
    impls: dict[str, Callable[[fx.GraphModule], Any]],
    repeat: int,
    memory: bool = True,
    compile_repeat: int | None = None,
    min_time_s: float = 0.0,
    log: Callable[[str], None] = lambda s: None,
    memory_runs: int | None = None,
) -> Row:
    """Times ``impls`` on one workload; peak memory is the median over ``memory_runs`` fresh
    processes (default: 3 up to 200k nodes, where one process's peak moves with the heap's
    layout, by up to half the source at 1k-10k nodes; 1 above)."""
    t0 = time.perf_counter()
    wl = workloads.build(shape, size)
    log(f"{shape} {size}: built {wl.num_nodes} nodes in {time.perf_counter() - t0:.1f}s")
    # Warm-up on a small graph of the same shape (first-call imports and caches).
    small = wl if shape == "model" else workloads.build(shape, 64)
    for fn in impls.values():
        fn(small.gm)
    row = Row(shape, size, wl.num_nodes, meta={k: v for k, v in wl.meta.items() if k != "expected"})
    row.page_us["before"] = page_cost_us()
    faults: dict[str, list[int]] = {}
    times: dict[str, list[float]] = {}
    for apart in (False, True):
        group = {k: v for k, v in impls.items() if (k in APART) == apart}
        if group:
            times |= measure(wl.gm, group, repeat, min_time_s=min_time_s, faults=faults)
    row.page_us["after"] = page_cost_us()
    for name, ts in times.items():
        med = statistics.median(ts)
        row.faults_per_run[name] = int(statistics.median(faults[name]))
        row.runs[name] = len(ts)
        row.median_s[name] = med
        row.ns_per_node[name] = med * 1e9 / wl.num_nodes
    log(f"{shape} {size}: timed in {time.perf_counter() - t0:.1f}s")
    crep = compile_repeat or (3 if wl.num_nodes <= 200_000 else 1)
    # Source, pool and compile() time come from the real generators, whatever ``impls`` holds.
    for name in ("fxcodegen", "reference"):
        if name not in impls:
            continue
        code, _, consts = implementation(name)(wl.gm)
        row.pool[name] = len(consts)
        row.source_bytes[name] = len(code.encode())
        row.compile_ns_per_node[name] = compile_seconds(code, crep) * 1e9 / wl.num_nodes
        del code, consts
    if memory and shape != "model":
        mrep = memory_runs or (3 if wl.num_nodes <= 200_000 else 1)
        for name in ("fxcodegen", "reference"):
            if name in impls:
                found = (peak_memory(shape, size, name) for _ in range(mrep))
                peaks = [m["peak_extra_bytes"] for m in found if m is not None]
                if peaks:
                    row.peak_extra_runs[name] = peaks
                    row.peak_extra_bytes[name] = int(statistics.median(peaks))
    log(f"{shape} {size}: done in {time.perf_counter() - t0:.1f}s")
    return row
