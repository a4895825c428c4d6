"""One pipeline per graph: each piece is planned once (its entries, its structural key, the
config patches of each entry), whatever path it then takes through the cache."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import fxcodegen
import fxcodegen.fingerprint
import fxcodegen.plan
import pytest
import torch
from _piecewise_helpers import ATTENTION
from fxcodegen.toy import make_decoder

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

RANGES = [(1, 8), (9, 32)]
SIZE = 12
LABELS = ["range:1-8", "range:9-32", "size:12"]
COMPILED_PIECES = 4  # a 3-layer decoder: 7 pieces, 3 of them splitting


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts of the per-piece computations, wherever in the package they are called."""
    out: collections.Counter[str] = collections.Counter()
    real_struct = fxcodegen.fingerprint.structural_key_stable
    real_entries = fxcodegen.plan.plan_entries

    def structural_key_stable(gm: torch.fx.GraphModule) -> tuple[str, bool]:
        out["structural_key"] += 1
        return real_struct(gm)

    def plan_entries(*args: Any, **kwargs: Any) -> Any:
        out["plan_entries"] += 1
        return real_entries(*args, **kwargs)

    for module in (fxcodegen.fingerprint, fxcodegen.plan):
        monkeypatch.setattr(module, "structural_key_stable", structural_key_stable)
    monkeypatch.setattr(fxcodegen.plan, "plan_entries", plan_entries)
    return out


def _run(compiler: str, cache_dir: Path | bool, calls: collections.Counter[str]) -> Any:
    def inductor_config(entry: Any) -> dict[str, Any]:
        calls[f"config {entry.label}"] += 1
        return {}

    model = make_decoder(num_layers=3, hidden=16, heads=2)
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION],
        compile_ranges=RANGES,
        compile_sizes=[SIZE],
        compiler=compiler,
        cache_dir=cache_dir,
        inductor_config=inductor_config,
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    x = torch.randn(9, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    (record,) = be.graphs
    return record


def _expect_once_per_piece(calls: collections.Counter[str]) -> None:
    assert calls["structural_key"] == COMPILED_PIECES
    assert calls["plan_entries"] == COMPILED_PIECES
    # a callable inductor_config is asked once per entry of each piece
    assert {label: calls[f"config {label}"] for label in LABELS} == dict.fromkeys(
        LABELS, COMPILED_PIECES
    )
    assert sum(n for k, n in calls.items() if k.startswith("config ")) == 3 * COMPILED_PIECES


def test_each_piece_is_planned_once_without_the_cache(calls: collections.Counter[str]) -> None:
    record = _run("eager", False, calls)
    assert record.num_entries == 3 * COMPILED_PIECES
    _expect_once_per_piece(calls)


@pytest.mark.slow
def test_each_piece_is_planned_once_on_a_miss_and_on_a_hit(
    calls: collections.Counter[str], tmp_path: Path
) -> None:
    cold = _run("inductor", tmp_path, calls)
    assert cold.cache == "miss" and cold.compiled == 3 * (COMPILED_PIECES - 1)
    _expect_once_per_piece(calls)

    calls.clear()
    torch._dynamo.reset()
    warm = _run("inductor", tmp_path, calls)
    assert warm.cache == "hit" and warm.compiled == 0 and warm.cache_key == cold.cache_key
    _expect_once_per_piece(calls)
