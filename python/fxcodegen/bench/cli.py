"""``python -m fxcodegen bench``: codegen speed on large graphs against the baselines.

Examples::

    python -m fxcodegen bench                                  # stitch, inline, model, runtime
    python -m fxcodegen bench --shape stitch --sizes 1000000 --impls fxcodegen,reference,floor
    python -m fxcodegen bench --shape runtime
    python -m fxcodegen bench --json benches/results.json      # also write the table as JSON

Times are medians of at least ``--repeat`` interleaved runs (more on small graphs, see
``--min-time``), in ns per node (nodes of the stitching graph plus those of inlined children);
torch.fx is timed in rounds of its own after the others' (see :mod:`fxcodegen.bench.runner`).
Ratios compare implementations measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

__all__ = ["main", "parse_sizes", "format_table"]

DEFAULT_SIZES = [1_000, 10_000, 100_000]
ALL_SHAPES = ["stitch", "inline", "model", "runtime"]
_SUFFIX = {"k": 1_000, "m": 1_000_000}


def parse_sizes(values: list[str]) -> list[int]:
    """``["1k,10k", "1000000"]`` → ``[1000, 10000, 1000000]``."""
    out = []
    for value in values:
        for part in value.split(","):
            part = part.strip().lower().replace("_", "")
            if not part:
                continue
            mult = _SUFFIX.get(part[-1], 1)
            num = part[:-1] if part[-1] in _SUFFIX else part
            out.append(int(float(num) * mult))
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"bad sizes {values!r}")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fxcodegen bench",
        description="Time fxcodegen.generate against vLLM's algorithm (reference), torch.fx "
        "python_code and the floor (a loop that only reads the nodes), in one process.",
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="graph sizes in nodes, e.g. 1k,10k,100k (default) or 1M (opt-in: memory, minutes)",
    )
    p.add_argument(
        "--shape",
        default="all",
        help="comma-separated: stitch, inline, model (a split Dynamo decoder), runtime "
        "(the compiled function over 128 trivial children); 'all' (default) runs every one",
    )
    p.add_argument(
        "--layers",
        default="32",
        help="decoder layers for the model shape, comma-separated (default 32)",
    )
    p.add_argument(
        "--impls",
        default="fxcodegen,reference,torch.fx,floor",
        help="implementations to time (torch.fx takes ~30 µs/node: drop it for 1M nodes)",
    )
    p.add_argument(
        "--repeat", type=int, default=5, help="interleaved runs per size, at least (median)"
    )
    p.add_argument(
        "--min-time",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="keep adding rounds (up to 101) until a size has been timed this long (default 10): "
        "more runs where each is cheap",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument(
        "--memory-runs",
        type=int,
        default=None,
        metavar="N",
        help="fresh processes per peak-memory figure, median (default 3 up to 200k nodes, 1 above)",
    )
    p.add_argument("--runtime-layers", type=int, default=128, help="children for --shape runtime")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def _pair(d: dict[str, Any], spec: str = "d") -> str:
    a, b = d.get("fxcodegen"), d.get("reference")
    return f"{_fmt(a, spec)}/{_fmt(b, spec)}"


def _fresh_page(page_us: dict[str, Any]) -> str:
    """A fresh page's cost before and after a row's runs, in µs."""
    costs = [page_us.get(k) for k in ("before", "after")]
    return "–".join(_fmt(c["fresh"] if c else None, ".1f") for c in costs)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows (``Row.as_dict()``) as a Markdown table."""
    head = [
        "shape",
        "nodes",
        "fxcodegen ns/node",
        "reference ns/node",
        "torch.fx ns/node",
        "floor ns/node",
        "ref/fxc",
        "fxc/floor",
        "pool fxc/ref",
        "source KiB fxc/ref",
        "compile() ns/node fxc/ref",
        "peak mem / source",
        "faults/run fxc",
        "fresh page µs",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for r in rows:
        ns = r["ns_per_node"]
        ratios = r["ratios"]
        kib = {k: v / 1024 for k, v in r["source_bytes"].items()}
        cells = [
            r["shape"],
            f"{r['nodes']:,}",
            _fmt(ns.get("fxcodegen")),
            _fmt(ns.get("reference")),
            _fmt(ns.get("torch.fx")),
            _fmt(ns.get("floor")),
            _fmt(ratios.get("reference/fxcodegen"), ".1f") + "×",
            _fmt(ratios.get("fxcodegen/floor"), ".2f"),
            _pair(r["pool"]),
            _pair(kib, ".0f"),
            _pair(r["compile_ns_per_node"], ".0f"),
            _fmt(ratios.get("peak/source"), ".2f"),
            _fmt(r.get("faults_per_run", {}).get("fxcodegen"), ",d"),
            _fresh_page(r.get("page_us", {})),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


LEGEND = (
    "reference: a pure-Python reimplementation of vLLM's codegen algorithm "
    "(fxcodegen.bench.reference), not vLLM's own module; ref/fxc: how many times faster "
    "generate is. floor: a Python loop that only reads each node's op, name, target, args and "
    "kwargs (fxcodegen.bench.floor); fxc/floor: generate's time over the floor's (1.00 or less: "
    "generate costs no more than reading the graph in Python)."
)


def format_runtime(rt: dict[str, Any]) -> str:
    lines = [
        f"runtime: one call of the stitching function over {rt['layers']} trivial opaque children",
        "",
        "| layout | ns/call (median) | × hand-written | ns/call (min) | × hand-written (min) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in rt["ns_per_call"].items():
        best = rt["ns_per_call_min"][name]
        lines.append(
            f"| {name} | {v:,.0f} | {rt['ratio_to_handwritten'][name]:.3f} "
            f"| {best:,.0f} | {rt['ratio_to_handwritten_min'][name]:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    from fxcodegen.bench import call_overhead, host, impls, runner, workloads

    try:
        sizes = parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES
        layers = parse_sizes([args.layers])
    except (argparse.ArgumentTypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shapes = ALL_SHAPES if args.shape == "all" else [s.strip() for s in args.shape.split(",")]
    bad = [s for s in shapes if s not in ALL_SHAPES]
    if bad:
        print(f"error: unknown shape(s) {bad}; choose from {ALL_SHAPES}", file=sys.stderr)
        return 2
    try:
        chosen = impls.available_impls([s.strip() for s in args.impls.split(",") if s.strip()])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    missing = impls.fxcodegen_error()
    if missing is not None:
        log(f"fxcodegen core not importable ({missing}); timing the baselines only")
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "command": "python -m fxcodegen bench "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": host.machine(),
        "repeat": args.repeat,
        "min_time_s": args.min_time,
        "rows": rows,
    }
    for shape in shapes:
        if shape == "runtime":
            continue
        if shape == "model":
            if not workloads.model_available():
                log("model shape skipped: fxcodegen.toy / fxcodegen.split_graph not available")
                continue
            shape_sizes = layers
        else:
            shape_sizes = sizes
        for size in shape_sizes:
            row = runner.run_shape(
                shape,
                size,
                chosen,
                args.repeat,
                memory=not args.no_memory,
                min_time_s=args.min_time,
                log=log,
                memory_runs=args.memory_runs,
            )
            rows.append(row.as_dict())
    if rows:
        print(format_table(rows))
        print()
        print(LEGEND)
    if "runtime" in shapes:
        log(f"runtime over {args.runtime_layers} children")
        result["runtime"] = call_overhead.runtime(args.runtime_layers)
        print()
        print(format_runtime(result["runtime"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
            f.write("\n")
        log(f"wrote {args.json}")
    return 0
