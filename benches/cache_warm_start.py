"""Cold vs warm start of the toy decoder through fxcodegen's artifact cache.

    .venv/bin/python benches/cache_warm_start.py [--layers 4 --hidden 64 --heads 4]
        [--ranges 1-16,17-128] [--sizes 32] [--json benches/cache_warm_start.json]

Each scenario is a separate process (``tests/_cache_child.py``) that builds the decoder,
``torch.compile``s it with ``fxcodegen.backend(cache_dir=...)`` (Inductor) and runs a few
sizes. Scenarios, in order:

1. ``cold``: empty fxcodegen cache, empty Inductor cache: everything compiles.
2. ``warm``: the fxcodegen cache from (1) and the Inductor cache directory (1) left behind
   (the usual case: ``TORCHINDUCTOR_CACHE_DIR`` persists): pieces loaded, the stitching
   code object unmarshaled; zero compiles, no codegen.
3. ``warm, empty Inductor dir``: the fxcodegen cache from (1), an **empty** Inductor cache
   directory (a fresh container): still zero Inductor compiles, but on CPU loading an
   artifact rebuilds its C++ kernels with the host compiler (the artifact holds their
   source, not the shared objects), which dominates.
4. ``inductor-cache only``: an empty fxcodegen cache but Inductor's cache from (1) warm:
   what Inductor's FX graph cache alone gives, for comparison.

Reported per scenario: backend wall time (from Dynamo handing over the graph to the stitching
function: split + key + compile-or-load + codegen-or-bind), its parts, the first call's
latency (Dynamo tracing + backend + the first run), the process total, and the counters.
Outputs of every scenario are checked to be identical to the cold run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from _toy_children import ROOT, add_model_args, child_config, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--json", default=str(ROOT / "benches" / "cache_warm_start.json"))
    args = p.parse_args(argv)

    base = child_config(args)
    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fxcodegen-warm-bench-") as tmp:
        t = Path(tmp)
        cache, inductor = t / "fxcodegen-cache", t / "inductor-cold"
        plan = [
            ("cold", cache, inductor),
            ("warm", cache, inductor),
            ("warm, empty Inductor dir", cache, t / "inductor-empty"),
            ("inductor-cache only", t / "fxcodegen-cache-empty", inductor),
        ]
        for name, cache_dir, inductor_dir in plan:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append((name, run({**base, "cache_dir": str(cache_dir)}, inductor_dir)))

    cold_out = [o["out"] for o in rows[0][1]["outputs"]]
    for name, r in rows:
        if [o["out"] for o in r["outputs"]] != cold_out:
            raise SystemExit(f"{name}: outputs differ from the cold run")
        if max(o["max_err_vs_eager"] for o in r["outputs"]) > 1e-3:
            raise SystemExit(f"{name}: outputs differ from eager")

    header = (
        f"{'scenario':<25} {'cache':<6} {'backend':>8} {'key':>6} {'compile/load':>12} "
        f"{'codegen/bind':>12} {'1st call':>9} {'process':>8} {'compiles':>8} {'loaded':>6}"
    )
    print(
        f"toy decoder: {args.layers} layers, hidden {args.hidden}, ranges {args.ranges}, "
        f"sizes {base['compile_sizes']}; {platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(header)
    print("-" * len(header))
    table = []
    for name, r in rows:
        g = r["graphs"][0]  # the symbolic graph (first call is dynamic)
        row = {
            "scenario": name,
            "cache": g["cache"],
            "backend_s": sum(x["backend_s"] for x in r["graphs"]),
            "key_s": g["key_s"],
            "compile_or_load_s": g["compile_s"],
            "codegen_or_bind_s": g["codegen_s"],
            "first_call_s": r["first_call_s"],
            "process_s": r["process_wall_s"],
            "import_s": r["import_s"],
            "counters": r["counters"],
            "graphs": r["graphs"],
        }
        table.append(row)
        print(
            f"{name:<25} {g['cache']:<6} {row['backend_s']:>7.2f}s {g['key_s']:>5.2f}s "
            f"{g['compile_s']:>11.2f}s {g['codegen_s'] * 1e3:>10.2f}ms "
            f"{r['first_call_s']:>8.2f}s {r['process_wall_s']:>7.1f}s "
            f"{r['counters'].get('compile', 0):>8} {r['counters'].get('artifact_loaded', 0):>6}"
        )
    cold, warm = table[0], table[1]
    print(
        f"warm vs cold: backend {cold['backend_s'] / warm['backend_s']:.1f}x faster, "
        f"first call {cold['first_call_s'] / warm['first_call_s']:.1f}x faster"
    )
    doc = {
        "config": base,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "rows": table,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
