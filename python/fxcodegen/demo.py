"""``python -m fxcodegen demo``: compile a model piecewise and check it against eager.

By default the embedded toy decoder (:func:`fxcodegen.toy.make_decoder`, split at its
attention custom op); ``--model llama`` (or gpt2, bert, ... see
:data:`fxcodegen.models.ARCHITECTURES`) builds a tiny Hugging Face model from a config in
code and splits it at ``torch.nn.functional.scaled_dot_product_attention``. The model is
compiled with :func:`fxcodegen.compile` over two size ranges and one single size (every
entry up front; a warm run loads the stored program without tracing), run at several
sizes and compared with eager (non-zero exit on a mismatch); the report gives each
program's load or trace, per-graph timings (trace or program load, split, compile by entry
kind, load, codegen, first run), compiled vs reused vs shared vs loaded piece-entries,
where the generated stitching code was written, and compiled-vs-eager speed. ``--json``
adds one line ``RESULT {...}`` with the figures, for scripts.
"""

from __future__ import annotations

import argparse
import json
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
FIRST_SIZE = 48


def _parse(argv: list[str]) -> argparse.Namespace:
    from fxcodegen.models import ARCHITECTURES

    p = argparse.ArgumentParser(prog="python -m fxcodegen demo", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        choices=["toy", *ARCHITECTURES],
        default="toy",
        help="toy (embedded, default) or a tiny Hugging Face architecture built from a config",
    )
    p.add_argument("--compiler", choices=["inductor", "eager"], default="inductor")
    p.add_argument("--layers", type=int, default=None, help="layers (default: toy 4, others 2)")
    p.add_argument("--hidden", type=int, default=64, help="toy hidden size (default 64)")
    p.add_argument("--heads", type=int, default=4, help="toy attention heads (default 4)")
    p.add_argument("--batch", type=int, default=1, help="batch of a Hugging Face model")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="artifact cache directory (default: $FXCODEGEN_CACHE_DIR, else ~/.cache/fxcodegen);"
        " 'off' disables it",
    )
    p.add_argument(
        "--code-dir",
        default=os.path.join(tempfile.gettempdir(), "fxcodegen-demo"),
        help="where the generated stitching code is written",
    )
    p.add_argument(
        "--check-sizes",
        default=",".join(map(str, CHECK_SIZES)),
        help="comma-separated sizes checked against eager",
    )
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (0: none)")
    p.add_argument("--json", action="store_true", help="print a RESULT line of JSON at the end")
    p.add_argument("-v", "--verbose", action="store_true", help="show fxcodegen's log")
    args = p.parse_args(argv)
    if args.layers is None:
        args.layers = 4 if args.model == "toy" else 2
    if args.layers < 1:
        p.error("--layers must be >= 1")
    if args.iters < 0:
        p.error("--iters must be >= 0")
    if args.batch < 1:
        p.error("--batch must be >= 1")
    try:
        args.check_sizes = [int(s) for s in args.check_sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--check-sizes must be comma-separated integers, got {args.check_sizes!r}")
    if any(not 1 <= n <= RANGES[-1][1] for n in args.check_sizes):
        p.error(f"--check-sizes must lie in 1..{RANGES[-1][1]}")
    return args


def _median_ms(fn: Callable[[], Any], iters: int) -> float:
    fn()  # warm
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


class _Workload:
    """A model, its splitting op, and how to make an input of ``n`` tokens and run it."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(0)
        if args.model == "toy":
            from fxcodegen.toy import ATTENTION_OP, make_decoder

            self.model = make_decoder(num_layers=args.layers, hidden=args.hidden, heads=args.heads)
            self.splitting_op = ATTENTION_OP
            self.title = (
                f"{args.layers}-layer toy decoder (hidden {args.hidden}, {args.heads} heads)"
            )
            self.inputs = lambda n: (
                torch.randn(n, args.hidden, generator=torch.Generator().manual_seed(n)),
            )
            self.run = lambda m, x: m(x)
        else:
            from fxcodegen.models import SDPA, tiny_model

            self.model = tiny_model(args.model, num_layers=args.layers)
            self.splitting_op = SDPA
            self.title = (
                f"tiny {args.layers}-layer {args.model} (random weights, batch {args.batch})"
            )
            self.inputs = lambda n: (
                torch.randint(0, 128, (args.batch, n), generator=torch.Generator().manual_seed(n)),
            )
            self.run = lambda m, x: m(input_ids=x).last_hidden_state


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.verbose:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("  [%(name)s] %(message)s"))
        logger = logging.getLogger("fxcodegen")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

    import fxcodegen

    work = _Workload(args)
    compiled = fxcodegen.compile(
        work.model,
        splitting_ops=[work.splitting_op],
        compile_ranges=RANGES,
        compile_sizes=[SINGLE_SIZE],
        compiler=args.compiler,
        cache_dir=False if args.cache_dir == "off" else args.cache_dir,
    )
    be = compiled.backend
    fxcodegen.counters.clear()
    print(f"fxcodegen demo: {work.title}, split at {work.splitting_op}, compiler {args.compiler}")
    print(
        f"  entries: ranges {', '.join(str(fxcodegen.Range(*r)) for r in RANGES)} "
        f"+ single size {SINGLE_SIZE}, all compiled up front"
    )

    # First call: the stored program is loaded (warm), or Dynamo traces once, the backend
    # splits, compiles every entry and stitches (cold).
    t0 = time.perf_counter()
    with torch.no_grad():
        work.run(compiled, *work.inputs(FIRST_SIZE))
    first_s = time.perf_counter() - t0
    rec = be.graphs[0]

    failures = 0
    max_err = 0.0
    print("\ncorrectness against eager:")
    with torch.no_grad():
        for n in args.check_sizes:
            (x,) = work.inputs(n)
            got = work.run(compiled, x)
            want = work.run(work.model, x)
            ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
            err = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
            max_err = max(max_err, err) if err == err else float("nan")
            # Dynamo specialises size 1, so it gets a second, static graph.
            g = be.graphs[-1] if n == 1 else rec
            piece = next(iter(g.pieces.values()), None)
            entry = piece.entry_for(n) if piece is not None else "-"
            print(
                f"  size {n:>4}: {'ok' if ok else 'MISMATCH'} (max abs err {err:.1e}), "
                f"graph {g.index}, entry {entry}"
            )
            failures += not ok

    print("\nprograms (Dynamo's bytecode and guards, one per call signature):")
    for prog in compiled.programs.values():
        print(f"  {prog.summary()}")
    print("\nphases (per graph):")
    for g in be.graphs:
        trace = "?" if g.trace_s is None else f"{g.trace_s:8.3f}s"
        kind = "symbolic graph" if g.symbolic else "static graph (size 1)"
        print(f"  graph {g.index}, {kind}, cache {g.cache}, {g.obtained}:")
        if g.obtained == "loaded without a trace":
            print(f"    program load          {g.program_s:8.3f}s  (no Dynamo trace)")
        else:
            print(f"    dynamo trace          {trace:>9}")
        print(
            f"    split                 {g.split_s:8.3f}s  ({g.num_pieces} pieces, {g.num_splitting} splitting)"
        )
        print(
            f"    compile + load        {g.compile_s:8.3f}s  ({g.num_entries} piece-entries: "
            f"{g.compiled} compiled, {g.reused} reused from identical pieces, "
            f"{g.shared} shared across entries, {g.loaded} loaded)"
        )
        for k in ("range", "size", "static"):
            if k in g.compile_by_kind:
                print(f"      {'compiling ' + k + ' entries':<20}{g.compile_by_kind[k]:8.3f}s")
        if g.loaded:
            print(f"      {'loading artifacts':<20}{g.load_s:8.3f}s")
        print(f"    codegen (stitching)   {g.codegen_s:8.4f}s")
        first = "not run" if g.first_run_s is None else f"{g.first_run_s:8.3f}s"
        print(f"    first run             {first:>9}  (includes Inductor's runtime autotuning)")
    print(f"  first call in total     {first_s:8.3f}s")

    c = fxcodegen.counters
    print(
        f"\ncompiles: {c['compile']} compiled, {c['compile_reused']} reused from identical pieces, "
        f"{c['compile_shared']} shared across entries, {c['artifact_loaded']} loaded; "
        f"{c['codegen']} stitching functions generated"
    )

    os.makedirs(args.code_dir, exist_ok=True)
    print("\ngenerated stitching code:")
    for g in be.graphs:
        path = os.path.join(args.code_dir, f"stitching_{args.model}_graph{g.index}.py")
        with open(path, "w") as f:
            f.write(g.code)
        print(f"  {path}  ({len(g.code.splitlines())} lines)")

    if args.iters:
        print(f"\nspeed (median of {args.iters} runs, torch threads {torch.get_num_threads()}):")
        with torch.no_grad():
            for n in SPEED_SIZES:
                (x,) = work.inputs(n)
                eager_ms = _median_ms(lambda x=x: work.run(work.model, x), args.iters)
                comp_ms = _median_ms(lambda x=x: work.run(compiled, x), args.iters)
                print(
                    f"  size {n:>4}: eager {eager_ms:7.3f} ms, compiled {comp_ms:7.3f} ms "
                    f"({eager_ms / comp_ms:.2f}x)"
                )

    if args.json:
        result = {
            "model": args.model,
            "compiler": args.compiler,
            "pieces": rec.num_pieces,
            "splitting": rec.num_splitting,
            "max_err": max_err,
            "failures": failures,
            "first_call_s": first_s,
            "counters": dict(c),
            "graphs": [
                {
                    "cache": g.cache,
                    "obtained": g.obtained,
                    "program_s": g.program_s,
                    "pieces": g.num_pieces,
                    "splitting": g.num_splitting,
                    "compiled": g.compiled,
                    "reused": g.reused,
                    "shared": g.shared,
                    "loaded": g.loaded,
                    "trace_s": g.trace_s,
                    "split_s": g.split_s,
                    "compile_s": g.compile_s,
                    "compile_by_kind": g.compile_by_kind,
                    "load_s": g.load_s,
                    "codegen_s": g.codegen_s,
                    "first_run_s": g.first_run_s,
                }
                for g in be.graphs
            ],
        }
        print("RESULT " + json.dumps(result))
    if failures:
        print(f"\nFAILED: {failures} size(s) differ from eager", file=sys.stderr)
        return 1
    print("\nall sizes match eager")
    return 0
