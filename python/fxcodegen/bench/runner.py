"""Time fxcodegen against its baselines, side by side in one process.

Implementations (each turns a workload's graph into source, or reads it):

- ``fxcodegen``: :func:`fxcodegen.generate`;
- ``reference``: :func:`fxcodegen.bench.reference.generate_execution_code` (vLLM's algorithm);
- ``torch.fx``: ``Graph.python_code`` on the stitching graph and on every inlined child;
- ``floor``: :func:`fxcodegen.bench.floor.read_graph`.

Runs are interleaved (one run of each implementation per round, the order rotating), and the
median is reported, so slow drifts of a shared machine hit every implementation alike. The
cyclic GC stays on, as in real use, but is collected before each run. torch.fx, which no target
compares with, is timed after the others' rounds, in the same process: its ``python_code`` run
on a graph leaves the floor's next read of that graph faster, which would flatter the floor.

Peak memory is measured in fresh subprocesses (``python -m fxcodegen.bench.runner memory ...``),
the median of three up to 200k nodes: the RSS high-water mark (``VmHWM``) is reset through
``/proc/self/clear_refs`` right before the call, so allocations of the Rust core, which
``tracemalloc`` cannot see, are counted.
"""

from __future__ import annotations

import ctypes
import gc
import json
import mmap
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.fx as fx

from fxcodegen.bench import floor, reference, workloads
from fxcodegen.bench.workloads import Workload

__all__ = [
    "APART",
    "IMPLS",
    "Row",
    "available_impls",
    "compile_seconds",
    "machine",
    "measure",
    "peak_memory",
    "run_shape",
    "runtime",
]

IMPLS = ("fxcodegen", "reference", "torch.fx", "floor")
APART = ("torch.fx",)
"""Timed in rounds of their own, after the others' (see the module's docstring)."""


def _fxcodegen(gm: fx.GraphModule) -> Any:
    import fxcodegen

    return fxcodegen.generate(gm)


def _reference(gm: fx.GraphModule) -> Any:
    return reference.generate_execution_code(gm)


def _graphs(gm: fx.GraphModule) -> list[fx.Graph]:
    out = [gm.graph]
    seen: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target not in seen:
            seen.add(node.target)
            child = gm._modules.get(node.target)
            if isinstance(child, fx.GraphModule):
                out += _graphs(child)
    return out


def _torch_fx(gm: fx.GraphModule) -> Any:
    return [g.python_code(root_module="self") for g in _graphs(gm)]


def _floor(gm: fx.GraphModule) -> Any:
    return floor.read_graph(gm)


_FUNCS: dict[str, Callable[[fx.GraphModule], Any]] = {
    "fxcodegen": _fxcodegen,
    "reference": _reference,
    "torch.fx": _torch_fx,
    "floor": _floor,
}


def fxcodegen_error() -> str | None:
    """Why ``import fxcodegen`` fails (the compiled core is missing), or None."""
    try:
        import fxcodegen  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def available_impls(names: list[str] | tuple[str, ...] = IMPLS) -> dict[str, Callable[..., Any]]:
    out = {}
    for name in names:
        if name not in _FUNCS:
            raise ValueError(f"unknown implementation {name!r} (choose from {', '.join(IMPLS)})")
        if name == "fxcodegen" and fxcodegen_error() is not None:
            continue
        out[name] = _FUNCS[name]
    return out


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


# --- peak memory, in a subprocess ------------------------------------------------------------


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _reset_peak() -> int:
    """Hands freed memory back and resets the RSS high-water mark (``VmHWM``) to the RSS, which it
    returns in KiB: what a call's peak extra memory is measured from."""
    _trim()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    return _status_kb("VmRSS")


def _build(shape: str, size: int) -> Workload:
    if shape == "model":
        return workloads.model(size)
    return workloads.SHAPES[shape](size)


def _memory_child(shape: str, size: int, impl: str) -> dict[str, Any]:
    fn = _FUNCS[impl]
    fn(_build(shape, 16).gm if shape != "model" else _build(shape, 1).gm)  # warm caches
    wl = _build(shape, size)
    before = _reset_peak()
    result = fn(wl.gm)
    peak = _status_kb("VmHWM")
    code = result[0] if isinstance(result, tuple) else None
    return {
        "shape": shape,
        "size": size,
        "impl": impl,
        "nodes": wl.num_nodes,
        "rss_before_kb": before,
        "peak_extra_bytes": (peak - before) * 1024,
        "source_bytes": len(code.encode()) if isinstance(code, str) else None,
    }


def peak_memory(shape: str, size: int, impl: str, timeout: float = 1800) -> dict[str, Any] | None:
    """Peak extra RSS of one ``impl`` run on a fresh process, or None where it cannot be read."""
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    cmd = [sys.executable, "-m", "fxcodegen.bench.runner", "memory", shape, str(size), impl]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    (:func:`page_cost_us`): the machine's price of fresh memory, which drifts."""
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
    wl = _build(shape, size)
    log(f"{shape} {size}: built {wl.num_nodes} nodes in {time.perf_counter() - t0:.1f}s")
    # Warm-up on a small graph of the same shape (first-call imports and caches).
    small = wl if shape == "model" else _build(shape, 64)
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
    for name, gen in (("fxcodegen", _fxcodegen), ("reference", _reference)):
        if name not in impls:
            continue
        code, _, consts = gen(wl.gm)
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


# --- runtime of the compiled stitching function ---------------------------------------------


def _handwritten(layers: int, children: list[Callable[..., Any]]) -> Callable[..., Any]:
    """What a person would write: direct calls of children bound as globals, no list index."""
    lines = ["def handwritten(x, s0):", "    v = x"]
    for i in range(layers):
        lines.append(f"    v = c{i}(v, x, s0, scale=0.5, sizes=[s0, 16])[0]")
    lines.append("    return v")
    ns: dict[str, Any] = {f"c{i}": c for i, c in enumerate(children)}
    exec(compile("\n".join(lines) + "\n", "<handwritten>", "exec"), ns)  # noqa: S102
    return ns["handwritten"]


def _time_call(fn: Callable[..., Any], args: tuple[Any, ...], number: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(number):
        fn(*args)
    return (time.perf_counter_ns() - t0) / number


def runtime(layers: int = 128, number: int = 2000, repeat: int = 31) -> dict[str, Any]:
    """ns per call of the stitching function over ``layers`` trivial opaque children, for each
    layout, and the ratio to the hand-written function. Every variant is checked to return the
    same value first."""
    wl = workloads.stitch(2 * layers + 3, shared_child=False)
    names = [f"submod_{i}" for i in range(layers)]
    children = [_child_copy() for _ in range(layers)]
    callables = dict(zip(names, children, strict=True))
    fns: dict[str, Callable[..., Any]] = {"hand-written": _handwritten(layers, children)}
    code, ref_names, consts = reference.generate_execution_code(wl.gm)
    fns["vllm layout (reference)"] = reference.compile_execution_fn(
        code, callables, ref_names, consts
    )
    if fxcodegen_error() is None:
        import fxcodegen

        gen = fxcodegen.generate(wl.gm)
        fns["fxcodegen"] = fxcodegen.compile_execution_fn(
            gen.code, callables, gen.submod_names, gen.consts
        )
        try:
            from fxcodegen.compat import vllm as compat
        except ImportError:
            compat = None
        if compat is not None:
            c_code, c_names, c_consts = compat.generate_execution_code(wl.gm)
            fns["fxcodegen.compat.vllm"] = compat.compile_execution_fn(
                c_code, callables, c_names, c_consts
            )
    x, s = torch.zeros(2), 4
    for name, fn in fns.items():
        if fn(x, s) is not x:
            raise AssertionError(f"{name} does not return its input through {layers} children")
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    gc.collect()
    for r in range(repeat):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            samples[name].append(_time_call(fns[name], (x, s), number))
    ns = {name: statistics.median(v) for name, v in samples.items()}
    best = {name: min(v) for name, v in samples.items()}
    return {
        "layers": layers,
        "calls_per_sample": number,
        "samples": repeat,
        "ns_per_call": ns,
        "ratio_to_handwritten": {name: v / ns["hand-written"] for name, v in ns.items()},
        # The fastest sample: less sensitive to other load on a shared machine.
        "ns_per_call_min": best,
        "ratio_to_handwritten_min": {name: v / best["hand-written"] for name, v in best.items()},
    }


def _child_copy() -> Callable[..., Any]:
    # A distinct function object per child, like distinct compiled pieces.
    f = workloads.trivial_piece
    return type(f)(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)


def page_cost_us(mib: int = 16, repeat: int = 3) -> dict[str, float] | None:
    """What writing a 4 KiB page costs now, in µs (medians of ``repeat`` probes of ``mib``
    MiB): ``fresh`` for a page first touched (the kernel finding, zeroing and mapping it, on
    top of the write), ``resident`` for one written again. Large graphs write tens of MB of
    fresh memory per call, and on a VM a fresh page can cost from a few to tens of µs, moving
    from minute to minute. None where the probe cannot run."""
    fresh: list[float] = []
    resident: list[float] = []
    n = mib << 20
    pages = n // 4096
    for _ in range(repeat):
        try:
            m = mmap.mmap(-1, n)
        except (OSError, ValueError):  # pragma: no cover
            return None
        try:
            view = ctypes.c_char.from_buffer(m)
            addr = ctypes.addressof(view)
            t0 = time.perf_counter()
            ctypes.memset(addr, 1, n)
            t1 = time.perf_counter()
            ctypes.memset(addr, 2, n)
            t2 = time.perf_counter()
            del view
        finally:
            m.close()
        resident.append((t2 - t1) / pages * 1e6)
        fresh.append((t1 - t0) / pages * 1e6 - resident[-1])
    return {"fresh": statistics.median(fresh), "resident": statistics.median(resident)}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover
        mem = None
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    if fxcodegen_error() is None:
        import fxcodegen
        from fxcodegen import _core

        info["fxcodegen"] = fxcodegen.__version__
        st = os.stat(_core.__file__)
        info["core"] = {
            "file": os.path.basename(_core.__file__),
            "bytes": st.st_size,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
            # Set by the core if it says how it was built (not every build does).
            "debug_assertions": getattr(_core, "__debug_build__", None),
        }
    return info


if __name__ == "__main__":
    # python -m fxcodegen.bench.runner memory SHAPE SIZE IMPL  -> one JSON line
    if len(sys.argv) == 5 and sys.argv[1] == "memory":
        print(json.dumps(_memory_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        sys.exit("usage: python -m fxcodegen.bench.runner memory SHAPE SIZE IMPL")
