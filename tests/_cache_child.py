"""A child process for the cache tests and the warm-start bench (not collected).

``python _cache_child.py CONFIG_JSON``: compiles the toy decoder with ``fxcodegen.backend``
(Inductor) into ``config["cache_dir"]``, runs it on ``config["sizes"]`` and prints one JSON
line on stdout (prefixed ``RESULT ``): counters, per-graph records, timings, the outputs
(as lists) and the warnings logged by ``fxcodegen``.

Config keys: ``cache_dir``, ``sizes`` (first is the first call), ``layers``, ``hidden``,
``heads``, ``ranges``, ``compile_sizes``, optional ``go`` (a file to wait for before
compiling, so that concurrent children start together) and ``ready`` (a file written when
imports are done); for the remote store ``remote_cache``, ``cache_secret``,
``remote_timeout``, and ``claim_ttl`` (seconds an entry claim lives unrenewed).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from _child_io import Collect, ready_then_go

T_START = time.perf_counter()


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (the host compiler)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    cfg = json.loads(sys.argv[1])
    import fxcodegen
    import torch
    from fxcodegen.toy import ATTENTION_OP, make_decoder

    collect = Collect.install()
    t_imported = time.perf_counter()

    if cfg.get("claim_ttl"):
        from fxcodegen.cache import remote

        remote.CLAIM_TTL_S = float(cfg["claim_ttl"])
    model = make_decoder(num_layers=cfg["layers"], hidden=cfg["hidden"], heads=cfg["heads"])
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION_OP],
        compile_ranges=[tuple(r) for r in cfg["ranges"]],
        compile_sizes=cfg["compile_sizes"],
        cache_dir=cfg["cache_dir"],
        progress=False,
        remote_cache=cfg.get("remote_cache"),
        cache_secret=cfg.get("cache_secret"),
        remote_timeout=cfg.get("remote_timeout"),
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    ready_then_go(cfg, timeout_s=600)

    outputs = []
    first_call_s = first_call_cpu_s = None
    t0 = time.perf_counter()
    with torch.no_grad():
        for i, n in enumerate(cfg["sizes"]):
            x = torch.randn(n, cfg["hidden"], generator=torch.Generator().manual_seed(n))
            t, c = time.perf_counter(), cpu_s()
            y = compiled(x)
            if i == 0:
                first_call_s = time.perf_counter() - t
                first_call_cpu_s = cpu_s() - c
            ref = model(x)
            outputs.append(
                {
                    "size": n,
                    "out": y.tolist(),
                    "max_err_vs_eager": float((y - ref).abs().max()),
                }
            )
    run_s = time.perf_counter() - t0
    graphs = [
        {
            "index": g.index,
            "symbolic": g.symbolic,
            "cache": g.cache,
            "key": g.cache_key,
            "compiled": g.compiled,
            "reused": g.reused,
            "loaded": g.loaded,
            "num_entries": g.num_entries,
            "key_s": g.key_s,
            "compile_s": g.compile_s,
            "codegen_s": g.codegen_s,
            # backend wall time: from Dynamo handing the graph to the stitching function
            "backend_s": g.split_s + g.key_s + g.compile_s + g.codegen_s,
        }
        for g in be.graphs
    ]
    result = {
        "pid": os.getpid(),
        "counters": dict(fxcodegen.counters),
        "graphs": graphs,
        "outputs": outputs,
        "import_s": t_imported - T_START,
        "first_call_s": first_call_s,
        "first_call_cpu_s": first_call_cpu_s,
        "run_s": run_s,
        "total_s": time.perf_counter() - T_START,
    }
    collect.report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
