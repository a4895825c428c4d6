"""Real Hugging Face architectures, built tiny from a config in code (no download), compiled
piecewise: split at attention by the names users write, checked against eager, and warm-started
from the artifact cache in a second process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import transformers  # noqa: F401 - a test dependency: fail loudly when it is missing
from fxcodegen import OutOfRangeError, backend, counters
from fxcodegen.models import tiny_model

LAYERS = 3
SEQ_LENS = [5, 16, 40]

# Each architecture is split by a different spelling of attention.
SPELLINGS = {
    "gpt2": "aten::scaled_dot_product_attention",
    "llama": "torch.nn.functional.scaled_dot_product_attention",
    "qwen2": F.scaled_dot_product_attention,
    "gemma": torch._C._nn.scaled_dot_product_attention,
    "bert": torch.ops.aten.scaled_dot_product_attention.default,
}


def _run(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_split_at_attention_matches_eager(name: str) -> None:
    torch._dynamo.reset()
    model = tiny_model(name, num_layers=LAYERS)
    be = backend(
        splitting_ops=[SPELLINGS[name]],
        compile_ranges=[(1, 16), (17, 64)],
        compiler="eager",
        cache_dir=False,
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    for batch in (1, 2):
        for n in SEQ_LENS:
            ids = torch.randint(0, 128, (batch, n), generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(_run(compiled, ids), _run(model, ids))
    graphs = [g for g in be.graphs if g.cache != "abandoned"]
    assert graphs, [g.cache for g in be.graphs]
    for g in graphs:
        assert g.num_splitting == LAYERS, g.summary()
        assert g.num_pieces == 2 * LAYERS + 1, g.summary()
        # Only the attention pieces are inlined; no compiled piece returns a Python scalar.
        for it in g.items:
            out = next(n for n in it.graph.graph.nodes if n.op == "output")
            for v in out.args[0]:
                assert isinstance(v.meta.get("example_value"), torch.Tensor), (it.submod_name, v)


def test_batch_and_tokens_both_symbolic_dispatch_on_tokens() -> None:
    torch._dynamo.reset()
    model = tiny_model("llama", num_layers=1)
    be = backend(
        splitting_ops=["aten::scaled_dot_product_attention"],
        compile_ranges=[(1, 32)],
        compile_sizes=[8],
        compiler="eager",
        cache_dir=False,
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    for batch, n in [
        (2, 10),
        (3, 8),
        (70, 5),
    ]:  # batch 70 lies in no range: it is not dispatched on
        ids = torch.randint(0, 128, (batch, n))
        torch.testing.assert_close(_run(compiled, ids), _run(model, ids))
    with pytest.raises(OutOfRangeError, match="size 40"):
        _run(compiled, torch.randint(0, 128, (2, 40)))


def test_range_dim_names_the_dispatched_size() -> None:
    torch._dynamo.reset()
    model = tiny_model("llama", num_layers=1)
    be = backend(
        splitting_ops=["aten::scaled_dot_product_attention"],
        compile_ranges=[(2, 4)],
        compiler="eager",
        cache_dir=False,
        range_dim=("input_ids", 0),
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    ids = torch.randint(0, 128, (3, 50))
    torch.testing.assert_close(_run(compiled, ids), _run(model, ids))
    with pytest.raises(OutOfRangeError, match="size 5"):
        _run(compiled, torch.randint(0, 128, (5, 50)))
    with pytest.raises(TypeError, match="range_dim"):
        backend(splitting_ops=[], range_dim="input_ids")


def test_an_op_matching_nothing_is_a_warning_naming_it(caplog) -> None:
    torch._dynamo.reset()
    model = tiny_model("gpt2", num_layers=1)
    be = backend(
        splitting_ops=["aten::scaled_dot_product_attention", "aten::topk"],
        compiler="eager",
        cache_dir=False,
    )
    with caplog.at_level(logging.WARNING, logger="fxcodegen"):
        _run(torch.compile(model, backend=be, dynamic=True), torch.randint(0, 128, (1, 9)))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("aten::topk matches no node of graph" in m for m in warned), warned
    assert not any("scaled_dot_product_attention" in m for m in warned), warned


def _demo(model: str, cache_dir: str, tmp: str) -> dict:
    """``python -m fxcodegen demo`` in a fresh process with fresh Inductor caches."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fxcodegen",
            "demo",
            "--model",
            model,
            "--cache-dir",
            cache_dir,
            "--check-sizes",
            "5,17,32,100",
            "--iters",
            "0",
            "--json",
            "--code-dir",
            tmp,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "phi3"])
def test_inductor_matches_eager_and_warm_start_compiles_nothing(name: str, tmp_path) -> None:
    cache = str(tmp_path / "cache")
    cold = _demo(name, cache, str(tmp_path / "cold"))
    assert cold["failures"] == 0 and cold["max_err"] < 1e-4, cold
    assert cold["splitting"] == 2 and cold["pieces"] == 5, cold
    assert cold["counters"].get("compile", 0) > 0, cold
    warm = _demo(name, cache, str(tmp_path / "warm"))
    assert warm["failures"] == 0 and warm["max_err"] < 1e-4, warm
    assert warm["counters"].get("compile", 0) == 0, warm
    assert warm["counters"]["artifact_loaded"] == cold["counters"]["compile"], (cold, warm)
    assert all(g["cache"] != "abandoned" for g in cold["graphs"]), cold  # one trace
    assert all(g["cache"] == "hit" for g in warm["graphs"]), warm
    assert all(g["obtained"] == "loaded without a trace" for g in warm["graphs"]), warm
    counters.clear()
