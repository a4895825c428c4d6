"""``python -m fxcodegen demo``: compile the toy decoder piecewise and check it against eager.

Builds :func:`fxcodegen.toy.make_decoder`, compiles it with :func:`fxcodegen.backend` over two
size ranges and one single size (every entry up front), runs several sizes and compares each
output with eager (non-zero exit on a mismatch), then prints per-phase timings, compiles vs
reused pieces, where the generated stitching code was written, and compiled-vs-eager speed.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

RANGES = [(1, 16), (17, 128)]
SINGLE_SIZE = 32
CHECK_SIZES = [1, 5, 16, 17, 32, 100, 128]
SPEED_SIZES = [16, 128]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fxcodegen demo", description=__doc__.split("\n")[0])
    p.add_argument("--compiler", choices=["inductor", "eager"], default="inductor")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument(
        "--code-dir",
        default=os.path.join(tempfile.gettempdir(), "fxcodegen-demo"),
        help="where the generated stitching code is written",
    )
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("-v", "--verbose", action="store_true", help="show fxcodegen's log")
    args = p.parse_args(argv)
    if args.layers < 1:
        p.error("--layers must be >= 1")
    if args.iters < 1:
        p.error("--iters must be >= 1")
    return args


def _median_ms(fn: Callable[[], Any], iters: int) -> float:
    fn()  # warm
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.verbose:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("  [%(name)s] %(message)s"))
        logger = logging.getLogger("fxcodegen")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

    import fxcodegen
    from fxcodegen.toy import ATTENTION_OP, make_decoder

    torch.manual_seed(0)
    model = make_decoder(num_layers=args.layers, hidden=args.hidden, heads=args.heads)
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION_OP],
        compile_ranges=RANGES,
        compile_sizes=[SINGLE_SIZE],
        compiler=args.compiler,
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    fxcodegen.counters.clear()
    print(
        f"fxcodegen demo: {args.layers}-layer decoder (hidden {args.hidden}, {args.heads} heads), "
        f"split at {ATTENTION_OP}, compiler {args.compiler}"
    )
    print(
        f"  entries: ranges {', '.join(str(fxcodegen.Range(*r)) for r in RANGES)} "
        f"+ single size {SINGLE_SIZE}, all compiled up front"
    )

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, args.hidden, generator=torch.Generator().manual_seed(n))

    # First call: Dynamo traces, the backend splits, compiles every entry and stitches.
    first = 48
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(inputs(first))
    first_s = time.perf_counter() - t0
    rec = be.graphs[0]
    trace_s = rec.entered_at - t0

    failures = 0
    print("\ncorrectness against eager:")
    with torch.no_grad():
        for n in CHECK_SIZES:
            x = inputs(n)
            got = compiled(x)
            want = model(x)
            ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
            err = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
            # Dynamo specialises size 1, so it gets a second, static graph.
            g = be.graphs[-1] if n == 1 else rec
            piece = next(iter(g.pieces.values()), None)
            entry = piece.entry_for(n) if piece is not None else "-"
            print(
                f"  size {n:>4}: {'ok' if ok else 'MISMATCH'} (max abs err {err:.1e}), "
                f"graph {g.index}, entry {entry}"
            )
            failures += not ok

    print("\nphases:")
    print(f"  dynamo trace            {trace_s:8.3f}s")
    for g in be.graphs:
        kind = "symbolic graph" if g.symbolic else "static graph (size 1)"
        print(f"  {kind}:")
        print(
            f"    split                 {g.split_s:8.3f}s  ({g.num_pieces} pieces, {g.num_splitting} splitting)"
        )
        print(
            f"    compile               {g.compile_s:8.3f}s  ({g.num_entries} piece-entries: "
            f"{g.compiled} compiled, {g.reused} reused)"
        )
        print(f"    codegen (stitching)   {g.codegen_s:8.4f}s")
    print(f"  first call in total     {first_s:8.3f}s")

    c = fxcodegen.counters
    print(
        f"\ncompiles: {c['compile']} compiled, {c['compile_reused']} reused from identical pieces, "
        f"{c['artifact_loaded']} loaded; {c['codegen']} stitching functions generated"
    )

    os.makedirs(args.code_dir, exist_ok=True)
    print("\ngenerated stitching code:")
    for g in be.graphs:
        path = os.path.join(args.code_dir, f"stitching_graph{g.index}.py")
        with open(path, "w") as f:
            f.write(g.code)
        print(f"  {path}  ({len(g.code.splitlines())} lines)")

    print(f"\nspeed (median of {args.iters} runs, torch threads {torch.get_num_threads()}):")
    with torch.no_grad():
        for n in SPEED_SIZES:
            x = inputs(n)
            eager_ms = _median_ms(lambda x=x: model(x), args.iters)
            comp_ms = _median_ms(lambda x=x: compiled(x), args.iters)
            print(
                f"  size {n:>4}: eager {eager_ms:7.3f} ms, compiled {comp_ms:7.3f} ms "
                f"({eager_ms / comp_ms:.2f}x)"
            )

    if failures:
        print(f"\nFAILED: {failures} size(s) differ from eager", file=sys.stderr)
        return 1
    print("\nall sizes match eager")
    return 0
