"""Real architectures, cold and warm: ``python benches/real_models.py [--compiler C] [MODEL ...]``.

For each tiny Hugging Face architecture (``fxcodegen.models.ARCHITECTURES``) this runs
``python -m fxcodegen demo --model NAME --json`` twice in fresh processes that share one empty
artifact cache (and each its own empty Inductor cache): the first is the cold start, the second
the warm start. It prints a Markdown table: pieces (splitting), the largest error against
eager over the checked sizes, the first call's seconds (model to first output, Dynamo trace
included) and the piece-entries compiled / loaded in each process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from fxcodegen.models import ARCHITECTURES


def _demo(model: str, compiler: str, cache: str, tmp: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
    cmd = [sys.executable, "-m", "fxcodegen", "demo", "--model", model, "--compiler", compiler]
    cmd += ["--cache-dir", cache, "--iters", "0", "--json", "--code-dir", tmp]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{model}: demo failed\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(line[-1][len("RESULT ") :])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", default=list(ARCHITECTURES))
    p.add_argument("--compiler", choices=["inductor", "eager"], default="inductor")
    args = p.parse_args()
    print(f"compiler {args.compiler}; 2 layers; ranges (1, 16), (17, 128) + size 32\n")
    print(
        "| model | pieces (splitting) | max abs err | cold first call s | warm first call s "
        "| cold compiled | warm compiled / loaded |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="fxcodegen-real-") as tmp:
            cache = os.path.join(tmp, "cache") if args.compiler == "inductor" else "off"
            cold = _demo(model, args.compiler, cache, os.path.join(tmp, "cold"))
            warm = _demo(model, args.compiler, cache, os.path.join(tmp, "warm"))
        err = max(cold["max_err"], warm["max_err"])
        cc, wc = cold["counters"], warm["counters"]
        print(
            f"| {model} | {cold['pieces']} ({cold['splitting']}) | {err:.1e} "
            f"| {cold['first_call_s']:.1f} | {warm['first_call_s']:.1f} "
            f"| {cc.get('compile', 0)} | {wc.get('compile', 0)} / {wc.get('artifact_loaded', 0)} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
