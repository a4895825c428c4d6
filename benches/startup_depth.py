"""Startup at depth: ``python benches/startup_depth.py [--layers 2,8,24] [--json FILE]``.

For a tiny Hugging Face Llama (hidden 64) of each depth, fresh processes side by side:
stock ``torch.compile(model, dynamic=True)`` (Inductor) cold and warm, and
``fxcodegen.compile(model, ...)`` (split at SDPA, one range) cold and warm. Cold starts
with empty caches (Inductor's and fxcodegen's); warm reuses the caches the cold process
left. "First call" runs from the model built to its first output, so it holds Dynamo's
trace, every compile or load and the first run; the table also shows how many graphs
Dynamo captured in that process (a warm ``fxcodegen.compile`` captures none) and the ratio
to stock. Every output is checked against eager.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TOKENS = 24


def child(cfg: dict) -> dict:
    t_start = time.perf_counter()
    import fxcodegen
    import torch
    import transformers
    from fxcodegen.models import ARCHITECTURES, SDPA

    config_cls, model_cls, kwargs = ARCHITECTURES["llama"]
    config = getattr(transformers, config_cls)(
        **kwargs, num_hidden_layers=cfg["layers"], attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    ids = torch.randint(0, 128, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    built = time.perf_counter()
    if cfg["kind"] == "stock":
        compiled = torch.compile(model, dynamic=True)
    else:
        compiled = fxcodegen.compile(
            model,
            splitting_ops=[SDPA],
            compile_ranges=[(1, 512)],
            cache_dir=cfg["cache_dir"],
            progress=False,
        )
    with torch.no_grad():
        out = compiled(input_ids=ids).last_hidden_state
        first_call_s = time.perf_counter() - built
        err = float((out - model(input_ids=ids).last_hidden_state).abs().max())
    return {
        "first_call_s": first_call_s,
        "import_and_build_s": built - t_start,
        "dynamo_graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "max_err": err,
        "compiled": fxcodegen.counters.get("compile", 0),
    }


def run(cfg: dict, inductor_dir: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_dir}
    env.pop("FXCODEGEN_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{cfg}: child failed\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="2,8,24")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    print(f"tiny Llama (hidden 64), input_ids (1, {TOKENS}); first call s (Dynamo graphs)\n")
    print("| layers | stock cold | fxcodegen cold | ratio | stock warm | fxcodegen warm | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for layers in [int(n) for n in args.layers.split(",")]:
        with tempfile.TemporaryDirectory(prefix="fxcodegen-depth-") as tmp:
            stock_ind, fx_ind = os.path.join(tmp, "ind-stock"), os.path.join(tmp, "ind-fx")
            fx = {"kind": "fxcodegen", "layers": layers, "cache_dir": os.path.join(tmp, "c")}
            stock = {"kind": "stock", "layers": layers}
            row = {
                "layers": layers,
                "stock_cold": run(stock, stock_ind),
                "fx_cold": run(fx, fx_ind),
                "stock_warm": run(stock, stock_ind),
                "fx_warm": run(fx, fx_ind),
            }
        rows.append(row)
        worst = max(r["max_err"] for k, r in row.items() if k != "layers")
        if worst > 1e-3:
            raise SystemExit(f"{layers} layers: output differs from eager by {worst}")

        def cell(r: dict) -> str:
            return f"{r['first_call_s']:.1f} ({r['dynamo_graphs']})"

        cold = row["fx_cold"]["first_call_s"] / row["stock_cold"]["first_call_s"]
        warm = row["fx_warm"]["first_call_s"] / row["stock_warm"]["first_call_s"]
        print(
            f"| {layers} | {cell(row['stock_cold'])} | {cell(row['fx_cold'])} | {cold:.2f}x "
            f"| {cell(row['stock_warm'])} | {cell(row['fx_warm'])} | {warm:.2f}x |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
