"""Time and peak memory of ``fxcodegen.emit`` (source from a serialized node list), each size in
fresh processes.

    python benches/serial_emit.py                      # stitch and inline, 100k and 1M, 3 processes each
    python benches/serial_emit.py --shape stitch --sizes 1M --processes 5

Each process builds the workload, serializes it, warms the core on a small graph, hands freed
memory back (``gc.collect``, ``malloc_trim``), resets the RSS high-water mark, then calls
``fxcodegen.emit`` ``--repeat`` times. It prints the first call's and the median time, and the
first call's peak extra RSS over the size of the source (the serialized bytes are resident
before it starts). Linux only (``/proc/self/clear_refs``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(shape: str, size: int, repeat: int) -> dict:
    import fxcodegen
    from fxcodegen.bench import workloads
    from fxcodegen.bench.peak_rss import reset_peak, status_kb

    data = fxcodegen.serialize(workloads.SHAPES[shape](size).gm)
    fxcodegen.emit(fxcodegen.serialize(workloads.SHAPES[shape](16).gm))
    before = reset_peak()  # as the bench's memory probe starts
    times, peak, source = [], 0, 0
    for i in range(repeat):
        t = time.perf_counter()
        code, _ = fxcodegen.emit(data)
        times.append(time.perf_counter() - t)
        if i == 0:
            peak, source = (status_kb("VmHWM") - before) * 1024, len(code)
        del code
    return {
        "shape": shape,
        "size": size,
        "first_ms": times[0] * 1e3,
        "median_ms": statistics.median(times) * 1e3,
        "peak_bytes": peak,
        "source_bytes": source,
    }


def main() -> None:
    from fxcodegen.bench.cli import parse_sizes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="stitch,inline")
    ap.add_argument("--sizes", default="100k,1M")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.repeat)))
        return
    for shape in args.shape.split(","):
        for size in parse_sizes([args.sizes]):
            rows = []
            for _ in range(args.processes):
                cmd = [sys.executable, __file__, "--child", shape, str(size)]
                cmd += ["--repeat", str(args.repeat)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
            first = statistics.median(r["first_ms"] for r in rows)
            median = statistics.median(r["median_ms"] for r in rows)
            ratio = statistics.median(r["peak_bytes"] / r["source_bytes"] for r in rows)
            print(
                f"{shape} {size}: first call {first:.1f} ms, median {median:.1f} ms, "
                f"peak/source {ratio:.2f} (source {rows[0]['source_bytes'] / 1e6:.1f} MB; "
                f"medians of {len(rows)} processes)"
            )


if __name__ == "__main__":
    main()
