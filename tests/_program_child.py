"""A child process for the ``fxcodegen.compile`` tests (not collected).

``python _program_child.py CONFIG_JSON``: builds a tiny Hugging Face model (or, with
``module_dir``, the ``Net`` of ``netmod.py`` there), compiles it with
``fxcodegen.compile`` (Inductor) into ``config["cache_dir"]``, calls it on
``config["sizes"]`` token counts and prints one ``RESULT`` JSON line: Dynamo's count of
captured graphs, fxcodegen's counters, each graph's record, each program's, the largest
difference from eager per call, and the ``fxcodegen`` log.

Config keys: ``cache_dir``, ``sizes``, ``ranges``, optional ``arch`` (default
``llama``), ``layers``, ``config`` (config overrides), ``dtype``, ``module_dir``,
``remote_cache``, ``cache_secret``.
"""

from __future__ import annotations

import json
import sys
import time

from _child_io import Collect

T_START = time.perf_counter()


def build(cfg: dict) -> tuple:
    import torch

    if cfg.get("module_dir"):
        sys.path.insert(0, cfg["module_dir"])
        import netmod

        torch.manual_seed(0)
        return netmod.Net().eval(), "x"
    import transformers
    from fxcodegen.models import ARCHITECTURES

    arch = cfg.get("arch", "llama")
    config_cls, model_cls, kwargs = ARCHITECTURES[arch]
    layers_key = "n_layer" if arch == "gpt2" else "num_hidden_layers"
    config = getattr(transformers, config_cls)(
        **kwargs,
        **{layers_key: cfg.get("layers", 2)},
        attn_implementation="sdpa",
        **cfg.get("config", {}),
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    if cfg.get("dtype"):
        model = model.to(getattr(torch, cfg["dtype"]))
    return model, "input_ids"


def main() -> int:
    cfg = json.loads(sys.argv[1])
    import fxcodegen
    import torch
    from fxcodegen.models import SDPA

    collect = Collect.install()
    model, arg = build(cfg)
    compiled = fxcodegen.compile(
        model,
        splitting_ops=["torch.relu"] if arg == "x" else [SDPA],
        compile_ranges=[tuple(r) for r in cfg["ranges"]],
        cache_dir=cfg["cache_dir"],
        progress=False,
        remote_cache=cfg.get("remote_cache"),
        cache_secret=cfg.get("cache_secret"),
    )
    errors = []
    first_call_s = None
    with torch.no_grad():
        for i, n in enumerate(cfg["sizes"]):
            g = torch.Generator().manual_seed(n)
            if arg == "x":
                x = torch.randn(n, 8, generator=g)
                got, want = compiled(x), model(x)
            else:
                ids = torch.randint(0, 128, (1, n), generator=g)
                t0 = time.perf_counter()
                got = compiled(input_ids=ids).last_hidden_state
                if i == 0:
                    first_call_s = time.perf_counter() - t0
                want = model(input_ids=ids).last_hidden_state
            errors.append(float((got - want).abs().max()))
    result = {
        "dynamo_graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "counters": dict(fxcodegen.counters),
        "graphs": [
            {
                "cache": g.cache,
                "obtained": g.obtained,
                "program": g.program_key,
                "text": g.summary(),
            }
            for g in compiled.graphs
        ],
        "programs": [
            {"key": p.key, "how": p.how, "results": len(p.aot.compiled_results)}
            for p in compiled.programs.values()
            if p.aot is not None
        ],
        "errors": errors,
        "first_call_s": first_call_s,
        "total_s": time.perf_counter() - T_START,
    }
    collect.report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
