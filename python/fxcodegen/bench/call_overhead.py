"""What one call of a compiled stitching function costs, layout by layout.

:func:`runtime` compiles the stitching function over trivial opaque children in each layout
(vLLM's, through the reference; fxcodegen's; ``fxcodegen.compat.vllm``'s where it imports) and
times it against :func:`handwritten`, the direct calls a person would write. This is
``python -m fxcodegen bench --shape runtime``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from fxcodegen.bench import reference, workloads
from fxcodegen.bench.impls import fxcodegen_error

__all__ = ["child_copy", "handwritten", "runtime"]


def handwritten(layers: int, children: list[Callable[..., Any]]) -> Callable[..., Any]:
    """What a person would write: direct calls of children bound as globals, no list index."""
    lines = ["def handwritten(x, s0):", "    v = x"]
    for i in range(layers):
        lines.append(f"    v = c{i}(v, x, s0, scale=0.5, sizes=[s0, 16])[0]")
    lines.append("    return v")
    ns: dict[str, Any] = {f"c{i}": c for i, c in enumerate(children)}
    exec(compile("\n".join(lines) + "\n", "<handwritten>", "exec"), ns)
    return ns["handwritten"]


def child_copy() -> Callable[..., Any]:
    """A fresh copy of :func:`~fxcodegen.bench.workloads.trivial_piece`."""
    # A distinct function object per child, like distinct compiled pieces.
    f = workloads.trivial_piece
    return type(f)(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)


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
    children = [child_copy() for _ in range(layers)]
    callables = dict(zip(names, children, strict=True))
    fns: dict[str, Callable[..., Any]] = {"hand-written": handwritten(layers, children)}
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
