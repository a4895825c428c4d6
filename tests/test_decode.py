"""The decode loop: compile ranges apply to the tokens of one call.

Hugging Face ``generate`` with the default ``DynamicCache`` calls the model with the prompt
(its tokens symbolic) and then with one token per step (``input_ids`` of ``(batch, 1)``,
static) and a KV cache whose length grows past every range. The decode graph must run the
entry for one token without dispatching on the cache length or the batch.

``model.compile(...)`` is ``torch.compile`` applied to the module's call, which
``generate`` goes through (the ``generate`` of a ``torch.compile(model)`` wrapper would run
the eager module).
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers  # noqa: F401 - a test dependency: fail loudly when it is missing
from fxcodegen import OutOfRangeError, backend
from fxcodegen.graph_inputs import RangeDim, dispatch_symbol
from fxcodegen.models import SDPA, tiny_model

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

PROMPTS = (8, 13)
NEW_TOKENS = 24  # the context reaches 37, past the range's end
RANGES = [(1, 16)]


def _ids(batch: int, n: int) -> torch.Tensor:
    return torch.randint(0, 128, (batch, n), generator=torch.Generator().manual_seed(n))


def _generate(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )


def _check_generate(name: str, compiler: str, prompts, **options) -> backend:
    """Greedy ``generate`` through the backend equals eager ``generate``, token for token."""
    eager = tiny_model(name, causal_lm=True)
    model = tiny_model(name, causal_lm=True)
    be = backend(
        splitting_ops=[SDPA], compile_ranges=RANGES, compiler=compiler, cache_dir=False, **options
    )
    model.compile(backend=be, dynamic=True)
    for batch, n in prompts:
        ids = _ids(batch, n)
        want = _generate(eager, ids)
        got = _generate(model, ids)
        assert got.shape == (batch, n + NEW_TOKENS)
        assert torch.equal(got, want), (name, batch, n, got, want)

    graphs = [g for g in be.graphs if g.cache != "abandoned"]
    prefill = [g for g in graphs if g.dispatch_symbol.symbol is not None]
    decode = [g for g in graphs if g.dispatch_symbol.size == 1]
    assert prefill and decode and len(prefill) + len(decode) == len(graphs), [
        str(g.dispatch_symbol) for g in graphs
    ]
    for g in prefill:
        assert (g.dispatch_symbol.arg, g.dispatch_symbol.dim) == ("input_ids", 1)
        assert any(p.sym_shape_indices for p in g.pieces.values()), g.summary()
    for g in decode:
        assert (g.dispatch_symbol.arg, g.dispatch_symbol.dim) == ("input_ids", 1)
        # the cache length stays symbolic, and no piece reads it to dispatch
        assert g.symbolic, g.summary()
        for piece in g.pieces.values():
            assert [e.label for e in piece.entries] == ["range:1-16"]
            assert piece.sym_shape_indices == []
    return be


@pytest.mark.parametrize("range_dim", [None, ("input_ids", 1)], ids=["default", "range_dim"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_generate_past_the_range_matches_eager(name: str, range_dim, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fxcodegen"):
        _check_generate(name, "eager", [(1, n) for n in PROMPTS], range_dim=range_dim)
    assert not [r.getMessage() for r in caplog.records if r.name == "fxcodegen"]


def test_batched_decode_dispatches_on_the_tokens_not_the_batch() -> None:
    # input_ids (2, 1): the batch is the only symbolic size of input_ids
    _check_generate("llama", "eager", [(2, 8), (3, 13)])


@pytest.mark.slow
def test_generate_with_inductor_matches_eager() -> None:
    _check_generate("llama", "inductor", [(1, 13)])


def test_a_static_token_size_outside_every_range_fails_when_compiled() -> None:
    model = tiny_model("llama", causal_lm=True)
    be = backend(splitting_ops=[SDPA], compile_ranges=[(2, 16)], compiler="eager", cache_dir=False)
    model.compile(backend=be, dynamic=True)
    with pytest.raises(Exception, match=r"input_ids, dim 1, is 1 in this graph") as info:
        _generate(model, _ids(1, 8))  # the prompt compiles and runs; the first step fails
    cause = info.value
    while cause is not None and not isinstance(cause, OutOfRangeError):
        cause = cause.__cause__ or getattr(cause, "inner_exception", None)
    assert isinstance(cause, OutOfRangeError), info.value
    assert "ranges: (2, 16); sizes: none" in str(cause)
    prefill, step = [g for g in be.graphs if g.cache != "abandoned"]
    assert prefill.dispatch_symbol.symbol is not None and step.pieces == {}


def test_out_of_range_names_the_argument() -> None:
    model = tiny_model("llama", num_layers=1)
    be = backend(splitting_ops=[SDPA], compile_ranges=RANGES, compiler="eager", cache_dir=False)
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        compiled(input_ids=_ids(1, 9))
        with pytest.raises(OutOfRangeError, match=r"size 20 \(input_ids, dim 1\) is in no"):
            compiled(input_ids=_ids(1, 20))


# dispatch_symbol on graphs Dynamo hands over ----------------------------------------------


class _Step(torch.nn.Module):
    """Reads a parameter and a buffer before its arguments, as Dynamo then orders them."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(16))
        self.register_buffer("table", torch.randn(128, 16))

    def forward(self, input_ids: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        table = self.table * self.scale
        return torch.cat([past, table[input_ids]], dim=1)


def _range_dim(fn, *args: torch.Tensor, range_dim=None, ranges=RANGES, sizes=()) -> RangeDim:
    """``dispatch_symbol`` of the graph Dynamo hands over for ``fn(*args)``, asked while the
    backend has it (Dynamo drops the inputs' sources from the graph afterwards)."""
    got: list[RangeDim | Exception] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        first = next(n for n in gm.graph.nodes if n.op == "placeholder")
        if isinstance(fn, _Step):
            assert "input_ids" not in first.name, "the test wants a parameter before the arguments"
        try:
            got.append(dispatch_symbol(gm, range_dim, ranges, sizes))
        except Exception as e:  # raised below, not wrapped by Dynamo
            got.append(e)
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=record, dynamic=True)(*args)
    (rd,) = got
    if isinstance(rd, Exception):
        raise rd
    return rd


def _step(batch: int, tokens: int, past: int, **kwargs) -> RangeDim:
    ids = torch.randint(0, 128, (batch, tokens))
    return _range_dim(_Step(), ids, torch.randn(batch, past, 16), **kwargs)


def test_the_default_is_the_tokens_of_the_first_argument() -> None:
    rd = _step(batch=2, tokens=5, past=7)
    assert (rd.arg, rd.dim, rd.size) == ("input_ids", 1, None) and rd.symbol is not None
    assert str(rd) == f"input_ids dim 1 = {rd.symbol}"


@pytest.mark.parametrize("range_dim", [None, ("input_ids", 1)])
def test_one_token_is_static_and_nothing_else_is_chosen(range_dim, caplog) -> None:
    # batch and past length are symbolic; the one token is not
    with caplog.at_level(logging.WARNING, logger="fxcodegen"):
        rd = _step(batch=2, tokens=1, past=7, range_dim=range_dim)
    assert rd == RangeDim("input_ids", 1, size=1)
    assert not caplog.records
    with pytest.raises(OutOfRangeError, match=r"input_ids, dim 1, is 1 in this graph"):
        _step(batch=2, tokens=1, past=7, range_dim=range_dim, ranges=[(2, 16)], sizes=[8])
    # a compile size covers it
    assert _step(batch=2, tokens=1, past=7, range_dim=range_dim, ranges=[(2, 16)], sizes=[1]) == rd


def test_activations_use_the_dimension_before_hidden() -> None:
    rd = _range_dim(lambda x: torch.relu(x) * 2, torch.randn(6, 16))
    assert (rd.arg, rd.dim) == ("x", 0) and rd.symbol is not None
