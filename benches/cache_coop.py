"""Cooperative cold start of the toy decoder: processes on one machine, "machines" sharing a
real Redis, and warm starts from Redis alone.

    .venv/bin/python benches/cache_coop.py [--layers 4 --hidden 64 --heads 4]
        [--ranges 1-16,17-128] [--sizes 32] [--json benches/cache_coop.json]

Every row is a separate process (``tests/_cache_child.py``); the bench starts its own
``redis-server`` on a free loopback port. ``TORCHINDUCTOR_CACHE_DIR`` is set per process.
Each "new" Inductor dir below starts as a copy of one in which an unrelated graph was
compiled: on CPU, Inductor's one-time setup of a cache directory is most of a process's
first compile, is not an entry of the model, and cannot be split;
``--fresh-inductor`` starts them empty instead.

1. ``alone``: one process, empty fxcodegen cache, a new Inductor dir.
2. ``pair, one dir`` (x2): two processes released together, one empty fxcodegen cache and
   one new Inductor dir shared (one machine: one user's Inductor cache is shared).
3. ``machine A/B`` (x2): two processes released together, each with its own empty
   fxcodegen cache and its own new Inductor dir, one Redis.
4. ``machine C, empty disk``: empty fxcodegen cache, a new Inductor dir, the same Redis.
5. ``warm, local`` / ``warm, Redis only``: machine A's Inductor dir (its kernels built);
   the first with machine A's fxcodegen cache, the second with an empty one and Redis.
   Each runs ``--warm-repeats`` times, alternating; the best of each is compared.

``--compile-threads 1`` makes each process compile on one core (Inductor's default on a
2-core machine is a pool of 2 compile workers per process). The first call's CPU seconds
(the process and the host compiler it ran) are reported next to its wall time: on a shared
machine they show the work on each process's critical path whatever else runs.
Outputs of every row are checked to be identical to the lone cold run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _redis_server import RedisServer  # noqa: E402
from _toy_children import add_model_args, child_config, child_env, finish, start  # noqa: E402

SECRET = "bench-secret-for-the-cooperative-cold-start"


def _together(tmp: Path, runs: list[tuple[dict[str, Any], Path]]) -> list[dict[str, Any]]:
    """Start the processes, wait until all are ready (imports done), release them."""
    go = tmp / f"go-{time.monotonic_ns()}"
    readies = [tmp / f"ready-{time.monotonic_ns()}-{i}" for i in range(len(runs))]
    t0 = time.perf_counter()
    procs = [
        start({**cfg, "ready": str(r), "go": str(go)}, d)
        for (cfg, d), r in zip(runs, readies, strict=True)
    ]
    while not all(r.exists() for r in readies):
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a child exited early: " + procs[0].communicate()[1][-3000:])
        time.sleep(0.02)
    go.write_text("go")
    return [finish(p, t0) for p in procs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--warm-repeats", type=int, default=2)
    p.add_argument(
        "--compile-threads",
        type=int,
        default=None,
        help="TORCHINDUCTOR_COMPILE_THREADS for every process (default: Inductor's own)",
    )
    p.add_argument("--pair-only", action="store_true", help="only 'alone' and 'pair, one dir'")
    p.add_argument(
        "--fresh-inductor",
        action="store_true",
        help="start every Inductor dir empty (default: each starts as a copy of one that "
        "compiled an unrelated graph, i.e. with Inductor's one-time per-directory setup done)",
    )
    p.add_argument("--json", default=str(ROOT / "benches" / "cache_coop.json"))
    args = p.parse_args(argv)
    if args.compile_threads is not None:
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(args.compile_threads)
    base = child_config(args)
    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fxcodegen-coop-bench-") as tmp_name:
        t = Path(tmp_name)
        server = RedisServer(t)
        remote = {"remote_cache": server.url, "cache_secret": SECRET}
        try:

            def step(name: str) -> None:
                print(f"running {name} ...", file=sys.stderr, flush=True)

            if not args.fresh_inductor:
                step("preparing the Inductor dir")
                _prewarm(t / "ind-base")
                for name in ("alone", "pair", "mA", "mB", "mC"):
                    shutil.copytree(t / "ind-base", t / f"ind-{name}")
            step("alone")
            (alone,) = _together(t, [({**base, "cache_dir": str(t / "alone")}, t / "ind-alone")])
            rows.append(("alone", alone))
            step("pair, one dir")
            pair_cfg = {**base, "cache_dir": str(t / "pair")}
            pair = _together(t, [(pair_cfg, t / "ind-pair"), (pair_cfg, t / "ind-pair")])
            rows += [("pair, one dir", r) for r in pair]
            if args.pair_only:
                raise _PairOnly
            step("two machines")
            machines = _together(
                t,
                [
                    ({**base, **remote, "cache_dir": str(t / "mA")}, t / "ind-mA"),
                    ({**base, **remote, "cache_dir": str(t / "mB")}, t / "ind-mB"),
                ],
            )
            rows += [("machine A", machines[0]), ("machine B", machines[1])]
            step("machine C")
            (third,) = _together(
                t, [({**base, **remote, "cache_dir": str(t / "mC")}, t / "ind-mC")]
            )
            rows.append(("machine C, empty disk", third))
            warm_local, warm_remote = [], []
            for i in range(args.warm_repeats):
                step(f"warm {i + 1}/{args.warm_repeats}")
                (w,) = _together(t, [({**base, "cache_dir": str(t / "mA")}, t / "ind-mA")])
                warm_local.append(w)
                empty = {**base, **remote, "cache_dir": str(t / f"warm-empty-{i}")}
                (w,) = _together(t, [(empty, t / "ind-mA")])
                warm_remote.append(w)
            best_local = min(warm_local, key=lambda r: r["first_call_s"])
            best_remote = min(warm_remote, key=lambda r: r["first_call_s"])
            rows += [("warm, local", best_local), ("warm, Redis only", best_remote)]
        except _PairOnly:
            pass
        finally:
            server.kill()

    ref = [o["out"] for o in alone["outputs"]]
    for name, r in rows:
        if [o["out"] for o in r["outputs"]] != ref:
            raise SystemExit(f"{name}: outputs differ from the lone cold run")
        if r["warnings"]:
            raise SystemExit(f"{name}: warnings: {r['warnings']}")
    header = (
        f"{'scenario':<22} {'cache':<5} {'1st call':>9} {'1st call CPU':>12} {'process':>8} "
        f"{'compile':>7} "
        f"{'loaded':>6} {'remote ld/st':>12}"
    )
    print(
        f"toy decoder: {args.layers} layers, hidden {args.hidden}, ranges {args.ranges}, "
        f"sizes {base['compile_sizes']}; {platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(header)
    print("-" * len(header))
    table = []
    for name, r in rows:
        c = r["counters"]
        keep = ("first_call_s", "first_call_cpu_s", "process_wall_s")
        table.append({"scenario": name, **{k: r[k] for k in keep}})
        table[-1].update(counters=c, cache=r["graphs"][0]["cache"])
        print(
            f"{name:<22} {r['graphs'][0]['cache']:<5} {r['first_call_s']:>8.2f}s "
            f"{r['first_call_cpu_s']:>11.2f}s {r['process_wall_s']:>7.1f}s {c.get('compile', 0):>7} "
            f"{c.get('artifact_loaded', 0):>6} "
            f"{c.get('remote_loaded', 0):>5}/{c.get('remote_stored', 0):<6}"
        )
    unique = alone["counters"]["compile"]
    ratios: dict[str, Any] = {
        "unique_entries": unique,
        "pair_total_compiles": sum(r["counters"].get("compile", 0) for r in pair),
        "pair_slower_first_call_vs_alone": max(r["first_call_s"] for r in pair)
        / alone["first_call_s"],
        "pair_slower_process_vs_alone": max(r["process_wall_s"] for r in pair)
        / alone["process_wall_s"],
        # CPU seconds of the first call (the process and the host compiler it ran): the work
        # on each process's critical path, whatever else the machine runs
        "pair_max_first_call_cpu_vs_alone": max(r["first_call_cpu_s"] for r in pair)
        / alone["first_call_cpu_s"],
        "pair_total_first_call_cpu_vs_alone": sum(r["first_call_cpu_s"] for r in pair)
        / alone["first_call_cpu_s"],
    }
    if not args.pair_only:
        ratios.update(
            machines_total_compiles=sum(r["counters"].get("compile", 0) for r in machines),
            machine_c_compiles=third["counters"].get("compile", 0),
            warm_redis_vs_local_first_call=best_remote["first_call_s"] / best_local["first_call_s"],
            warm_redis_vs_local_process=best_remote["process_wall_s"]
            / best_local["process_wall_s"],
        )
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")
    doc = {
        "config": base,
        "inductor_dirs": "fresh" if args.fresh_inductor else "prewarmed with an unrelated graph",
        "cpus": os.cpu_count(),
        "compile_threads": args.compile_threads,
        "load_average_after": os.getloadavg(),
        "rows": table,
        "ratios": ratios,
    }
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


_PREWARM = """
import torch
gm = torch.fx.symbolic_trace(lambda x, y: (x @ y).relu() + 1)
torch._inductor.standalone_compile(gm, [torch.randn(8, 8), torch.randn(8, 8)],
                                   dynamic_shapes="from_example_inputs")
"""


def _prewarm(inductor_dir: Path) -> None:
    """Compile an unrelated graph into ``inductor_dir``: Inductor's one-time setup of a cache
    directory (on CPU, most of a first compile), none of the decoder's entries."""
    subprocess.run([sys.executable, "-c", _PREWARM], env=child_env(inductor_dir), check=True)


class _PairOnly(Exception):
    """Raised to stop after the pair (``--pair-only``)."""


if __name__ == "__main__":
    sys.exit(main())
