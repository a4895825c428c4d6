"""What the cache benches share: the toy decoder's arguments and the processes that compile
it (``tests/_cache_child.py``), each printing one ``RESULT`` line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "_cache_child.py"


def _ranges(text: str) -> list[list[int]]:
    return [[int(a), int(b)] for a, _, b in (p.partition("-") for p in text.split(","))]


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The decoder's size, its compile ranges and sizes, and the sizes each process runs."""
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ranges", type=_ranges, default=_ranges("1-16,17-128"))
    p.add_argument("--sizes", default="32", help="single compile sizes, comma-separated")
    p.add_argument("--run-sizes", default="20,5,32,100", help="sizes run (first: first call)")


def child_config(args: argparse.Namespace) -> dict[str, Any]:
    """The child's config from :func:`add_model_args`' arguments (no cache dir yet)."""
    return {
        "layers": args.layers,
        "hidden": args.hidden,
        "heads": args.heads,
        "ranges": args.ranges,
        "compile_sizes": [int(s) for s in args.sizes.split(",") if s],
        "sizes": [int(s) for s in args.run_sizes.split(",") if s],
    }


def child_env(inductor_dir: Path) -> dict[str, str]:
    """Inductor's cache in ``inductor_dir``, none of the user's fxcodegen variables."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    for var in ("FXCODEGEN_PROGRESS", "FXCODEGEN_REMOTE_CACHE", "FXCODEGEN_CACHE_DIR"):
        env.pop(var, None)
    return env


def start(cfg: dict[str, Any], inductor_dir: Path) -> subprocess.Popen[str]:
    """One child, with :func:`child_env`."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(cfg)],
        env=child_env(inductor_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen[str], t0: float) -> dict[str, Any]:
    """The child's result, with ``process_wall_s`` measured from ``t0``."""
    out, err = p.communicate(timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"child failed with status {p.returncode}")
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    r["process_wall_s"] = wall
    return r


def run(cfg: dict[str, Any], inductor_dir: Path) -> dict[str, Any]:
    """One child, to its end."""
    t0 = time.perf_counter()
    return finish(start(cfg, inductor_dir), t0)
