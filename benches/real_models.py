"""Real architectures, cold and warm: ``python benches/real_models.py [--compiler C] [MODEL ...]``.

For each tiny Hugging Face architecture (``fxcodegen.models.ARCHITECTURES``) this runs
``python -m fxcodegen demo --model NAME --json`` three times in fresh processes that share one
empty artifact cache: cold (an empty Inductor cache as well), warm on the same machine (the
Inductor cache the cold process left), and warm on a new machine (an empty Inductor cache: on
CPU, loading an artifact builds its C++ kernels again). It prints a Markdown table: pieces
(splitting), the largest error against eager over the checked sizes, each first call's seconds
(model to first output, Dynamo trace included) and the piece-entries compiled in each process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from fxcodegen.models import ARCHITECTURES


def _demo(model: str, compiler: str, cache: str, tmp: str, inductor: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor}
    cmd = [sys.executable, "-m", "fxcodegen", "demo", "--model", model, "--compiler", compiler]
    cmd += ["--cache-dir", cache, "--iters", "0", "--json", "--code-dir", tmp, "-v"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{model}: demo failed\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    result = json.loads(line[-1][len("RESULT ") :])
    result["misses"] = [ln for ln in proc.stdout.splitlines() if "cache: miss for" in ln]
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", default=list(ARCHITECTURES))
    p.add_argument("--compiler", choices=["inductor", "eager"], default="inductor")
    args = p.parse_args()
    print(f"compiler {args.compiler}; 2 layers; ranges (1, 16), (17, 128) + size 32\n")
    print(
        "| model | pieces (splitting) | max abs err | first call s: cold | warm | warm, new "
        "machine | compiled: cold | warm | warm, new machine |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="fxcodegen-real-") as tmp:
            cache = os.path.join(tmp, "cache") if args.compiler == "inductor" else "off"
            ind = os.path.join(tmp, "inductor")
            runs = [
                _demo(model, args.compiler, cache, os.path.join(tmp, "cold"), ind),
                _demo(model, args.compiler, cache, os.path.join(tmp, "warm"), ind),
                _demo(model, args.compiler, cache, os.path.join(tmp, "new"), ind + "-new"),
            ]
        err = max(r["max_err"] for r in runs)
        first = " | ".join(f"{r['first_call_s']:.1f}" for r in runs)
        compiled = " | ".join(str(r["counters"].get("compile", 0)) for r in runs)
        print(
            f"| {model} | {runs[0]['pieces']} ({runs[0]['splitting']}) | {err:.1e} | {first} "
            f"| {compiled} |",
            flush=True,
        )
        for r in runs[1:]:
            for miss in r["misses"]:
                print(f"  {model}: warm {miss.strip()}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
