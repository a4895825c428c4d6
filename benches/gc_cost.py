"""What runs before a timed call, and what it costs: ``generate`` and the floor, back to back,
after each other, and after the bench's ``gc.collect()``.

    python benches/gc_cost.py                                  # inline 100k, 10 rounds
    python benches/gc_cost.py --shape stitch --sizes 100k --rounds 20 --flush-mib 1024

``python -m fxcodegen bench`` times the implementations in turn on one graph and collects
garbage before every timed call. In each round this times each of ``generate`` and the floor
(one graph, one process) four ways: right after the other one ran; right after its own previous
call (back to back: what it left in the caches is still there); after the other one and a
``gc.collect()`` (the bench's setting); and (``--flush-mib``) after the other one and a write to
every cache line of a buffer of that size. Prints the median ns/node and page faults per call
(``ru_minflt``, every thread) of each.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
from collections.abc import Callable

from fxcodegen.bench import workloads
from fxcodegen.bench.cli import parse_sizes
from fxcodegen.bench.impls import implementation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="inline", choices=["stitch", "inline"])
    ap.add_argument("--sizes", default="100k")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--flush-mib", type=int, default=0, help="also time after evicting this much")
    args = ap.parse_args(argv)
    settings: dict[str, Callable[[], object]] = {
        "after the other": lambda: None,
        "back to back": lambda: None,
        "after the other + gc": gc.collect,
    }
    if args.flush_mib:
        buf = bytearray(args.flush_mib << 20)
        view = memoryview(buf)[::64]  # one byte per cache line
        ones = b"\x01" * len(view)  # made once: no allocation between the timed calls

        def flush() -> None:
            view[:] = ones

        settings[f"after the other + {args.flush_mib} MiB"] = flush
    impls = {name: implementation(name) for name in ("fxcodegen", "floor")}
    for size in parse_sizes([args.sizes]):
        wl = workloads.build(args.shape, size)
        times: dict[tuple[str, str], list[int]] = {}
        faults: dict[tuple[str, str], list[int]] = {}
        for _ in range(args.rounds):
            for impl, fn in impls.items():
                other = next(f for name, f in impls.items() if name != impl)
                for setting, pre in settings.items():
                    if setting != "back to back":
                        other(wl.gm)
                    pre()
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t0 = time.perf_counter_ns()
                    fn(wl.gm)
                    times.setdefault((impl, setting), []).append(time.perf_counter_ns() - t0)
                    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    faults.setdefault((impl, setting), []).append(f1 - f0)
        print(f"{args.shape} {wl.num_nodes} nodes, {args.rounds} rounds: median ns/node (faults)")
        for (impl, setting), ts in times.items():
            ns = statistics.median(ts) / wl.num_nodes
            flt = statistics.median(faults[impl, setting])
            print(f"  {impl:<10} {setting:<28} {ns:8.1f}  ({flt:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
