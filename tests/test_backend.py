from __future__ import annotations

import logging

import fxcodegen
import pytest
import torch
from _piecewise_helpers import ATTENTION
from fxcodegen import OutOfRangeError, PiecewiseBackend, counters
from fxcodegen.toy import make_decoder

RANGES = [(1, 8), (9, 32)]
SIZE = 12


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _x(n: int, hidden: int) -> torch.Tensor:
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(n))


def _check_decoder(compiler: str, hidden: int) -> fxcodegen.backend:
    """Compile a 3-layer decoder, check every entry and a static size against eager."""
    model = make_decoder(num_layers=3, hidden=hidden, heads=2)
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION],
        compile_ranges=RANGES,
        compile_sizes=[SIZE],
        compiler=compiler,
        cache_dir=False,  # counts compiles; the cache is tested in test_cache_backend.py
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        # every entry, at and around its boundaries: ranges (1, 8), (9, 32), size 12
        for n in (2, 8, 9, 11, 12, 13, 32):
            x = _x(n, hidden)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert len(be.graphs) == 1
        rec = be.graphs[0]
        assert rec.symbolic
        # 7 pieces: 3 splitting (inlined), 4 compiled of which the 2 middles are identical
        assert (rec.num_pieces, rec.num_splitting) == (7, 3)
        assert rec.num_entries == 4 * 3
        assert (rec.compiled, rec.reused, rec.loaded) == (3 * 3, 1 * 3, 0)
        assert dict(counters) == {"compile": 9, "compile_reused": 3, "codegen": 1}
        piece = rec.pieces["submod_0"]
        assert [piece.entry_for(n).label for n in (8, 9, 12, 32)] == [
            "range:1-8",
            "range:9-32",
            "size:12",
            "range:9-32",
        ]
        # compiled pieces are PiecewiseBackends, splitting pieces stay plain GraphModules
        for it in rec.items:
            child = rec.split_gm.get_submodule(it.submod_name)
            want = torch.fx.GraphModule if it.is_splitting_graph else PiecewiseBackend
            assert isinstance(child, want), it.submod_name
        assert "def execution_fn" in rec.code

        # size 1 is specialised by Dynamo: a static graph, one entry per piece
        x = _x(1, hidden)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert len(be.graphs) == 2
        static = be.graphs[1]
        assert not static.symbolic
        assert (static.num_entries, static.compiled, static.reused) == (4, 3, 1)
        assert counters["codegen"] == 2

        with pytest.raises(OutOfRangeError, match=r"size 33 .*\(1, 8\), \(9, 32\); sizes: 12"):
            compiled(_x(33, hidden))
    return be


def test_backend_eager_decoder_all_entries_and_static_size() -> None:
    _check_decoder("eager", hidden=16)


@pytest.mark.slow
def test_backend_inductor_decoder_all_entries_and_static_size() -> None:
    be = _check_decoder("inductor", hidden=32)
    # Inductor entries can be exported for the artifact cache
    arts = be.graphs[0].pieces["submod_2"].export_artifacts()
    assert len(arts) == 3 and all(isinstance(b, bytes) for b in arts.values())


def test_backend_default_range_logging_and_progress(caplog, capsys) -> None:
    model = make_decoder(num_layers=2, hidden=8, heads=2)
    be = fxcodegen.backend(splitting_ops=[ATTENTION], compiler="eager", progress=True)
    compiled = torch.compile(model, backend=be, dynamic=True)
    x = _x(5, 8)
    with caplog.at_level(logging.INFO, logger="fxcodegen"), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        big = _x(3000, 8)
        torch.testing.assert_close(compiled(big), model(big), rtol=1e-4, atol=1e-4)
    rec = be.graphs[0]
    assert all(len(p.entries) == 1 for p in rec.pieces.values())  # one range: all sizes
    text = caplog.text
    assert "split into 5 pieces (2 splitting)" in text
    assert "3 piece-entries with eager in" in text and "(3 compiled, 0 reused" in text
    assert "generated the stitching function" in text
    assert "graph 0 (symbolic): 5 pieces" in text  # the summary line
    assert "3 piece-entries: 3 compiled, 0 reused" in text
    err = capsys.readouterr().err
    assert "3/3 piece-entries" in err


def test_backend_rejects_bad_configuration(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown splitting op 'nope::nothing'"):
        fxcodegen.backend(splitting_ops=["nope::nothing"])
    with pytest.raises(TypeError, match="single string"):
        fxcodegen.backend(splitting_ops=ATTENTION)
    with pytest.raises(ValueError, match="unknown compiler"):
        fxcodegen.backend(splitting_ops=[ATTENTION], compiler="tvm")
    with pytest.raises(ValueError, match="overlap"):
        fxcodegen.backend(splitting_ops=[ATTENTION], compile_ranges=[(1, 8), (4, 9)])
    be = fxcodegen.backend(splitting_ops=[ATTENTION], cache_dir=tmp_path)
    assert be.cache_dir == str(tmp_path)
    assert counters["compile"] == 0  # nothing compiled before Dynamo hands a graph


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"splitting_ops": None}, TypeError, "splitting_ops must be a list of ops"),
        ({"splitting_ops": 42}, TypeError, "splitting_ops must be a list of ops"),
        ({"splitting_ops": [], "compile_ranges": []}, ValueError, "compile_ranges is empty"),
    ],
)
def test_backend_arguments_that_cannot_work_fail_at_once(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        fxcodegen.backend(**kwargs)
    # a size alone is enough
    fxcodegen.backend(splitting_ops=[], compile_ranges=[], compile_sizes=[8])


class _ScaledAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)
        self.scale = 0.37  # a float attribute: Dynamo makes it an input under dynamic=True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj(x).view(1, x.shape[0], 3, 16).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return a * self.scale + 1.0


def test_float_inputs_are_specialised_before_anything_compiles() -> None:
    torch._dynamo.reset()
    counters.clear()
    model = _ScaledAttention().eval()
    be = fxcodegen.backend(
        splitting_ops=["aten::scaled_dot_product_attention"], compiler="eager", cache_dir=False
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        x = torch.randn(7, 16)
        torch.testing.assert_close(compiled(x), model(x))
        abandoned = [g for g in be.graphs if g.cache == "abandoned"]
        used = [g for g in be.graphs if g.cache != "abandoned"]
        assert len(abandoned) == 1 and abandoned[0].num_entries == 0, be.graphs
        assert len(used) == 1 and used[0].num_splitting == 1
        assert counters["compile"] == used[0].num_entries  # nothing compiled for the first trace
        # the float is baked in, guarded: another value is a new graph, not a wrong result
        model.scale = 0.5
        torch.testing.assert_close(compiled(x), model(x))
