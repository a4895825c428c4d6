"""Real graphs: ``make_fx`` of a small model, and ``torch.compile``'s Dynamo graph of a model with
a custom op, split at that op with ``fxcodegen.split_graph``; generated functions must equal
the eager model."""

from __future__ import annotations

from typing import Any

import fxcodegen
import pytest
import torch
from fxcodegen.compat import vllm
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

OP_NAME = "fxcodegen_test::scale_add"


@torch.library.custom_op(OP_NAME, mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + y


@scale_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.register_buffer("bias", torch.linspace(0, 1, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.a(x))
        h = torch.ops.fxcodegen_test.scale_add(h, x, 0.5)
        h = self.norm(h + self.bias)
        h2 = torch.ops.fxcodegen_test.scale_add(self.b(h), h, -2.0)
        return h2.sum(-1), h2[..., 1:3].to(torch.float64)


def assert_close_tree(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
        return
    assert isinstance(b, (tuple, list)) and len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert_close_tree(x, y)


def opaque_pieces(split_gm: fx.GraphModule, keep_inlined: set[str]) -> dict[str, Any]:
    """Callables standing in for compiled pieces: every piece not in ``keep_inlined``."""
    out: dict[str, Any] = {}
    for name, child in split_gm.named_children():
        if name not in keep_inlined:
            out[name] = child.forward
    return out


def test_make_fx_model() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        gm = make_fx(model)(x)
        want = model(x)
    gen = fxcodegen.generate(gm)
    assert gen.submod_names == []
    assert (
        "torch.ops.aten." in gen.code and "torch.ops.fxcodegen_test.scale_add.default(" in gen.code
    )
    # parameters and buffers reach the code through the pool, by identity
    attrs = {id(getattr(gm, n.target)) for n in gm.graph.nodes if n.op == "get_attr"}
    assert attrs and attrs <= {id(c) for c in gen.consts}
    with torch.no_grad():
        assert_close_tree(fxcodegen.build(gm)(x), want)
        assert_close_tree(fxcodegen.build(gm)(x), gm(x))
        code, names, consts = vllm.generate_execution_code(gm)
        assert_close_tree(vllm.compile_execution_fn(code, {}, names, consts)(x), want)


def test_make_fx_split_at_custom_op() -> None:
    torch.manual_seed(1)
    model = Block().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        gm = make_fx(model)(x)
        want = model(x)
    split_gm, items = fxcodegen.split_graph(gm, [OP_NAME])
    assert [i.is_splitting_graph for i in items] == [False, True, False, True, False]
    with torch.no_grad():
        assert_close_tree(fxcodegen.build(split_gm)(x), want)
        gen = fxcodegen.generate(split_gm)
        # Non-splitting pieces opaque (as if compiled), splitting pieces inlined.
        splitting = {i.submod_name for i in items if i.is_splitting_graph}
        fn = fxcodegen.compile_execution_fn(
            gen.code, opaque_pieces(split_gm, splitting), gen.submod_names, gen.consts
        )
        assert_close_tree(fn(x), want)


def dynamo_graph(model: torch.nn.Module, x: torch.Tensor) -> tuple[fx.GraphModule, list[Any]]:
    captured: list[tuple[fx.GraphModule, list[Any]]] = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(x)
    torch._dynamo.reset()
    assert len(captured) == 1
    return captured[0]


def test_dynamo_graph_split_at_custom_op() -> None:
    torch.manual_seed(2)
    model = Block().eval()
    x = torch.randn(4, 8)
    gm, example_inputs = dynamo_graph(model, x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.fxcodegen_test.scale_add.default in targets or any(
        getattr(t, "_qualified_op_name", None) == OP_NAME for t in targets
    )
    with torch.no_grad():
        want = model(x)
        assert_close_tree(gm(*example_inputs), want)

        # The whole Dynamo graph, unsplit.
        assert_close_tree(fxcodegen.build(gm)(*example_inputs), want)

        split_gm, items = fxcodegen.split_graph(gm, [OP_NAME])
        splitting = [i for i in items if i.is_splitting_graph]
        assert len(splitting) == 2
        assert_close_tree(fxcodegen.build(split_gm)(*example_inputs), want)

        gen = fxcodegen.generate(split_gm)
        names = {i.submod_name for i in splitting}
        fn = fxcodegen.compile_execution_fn(
            gen.code, opaque_pieces(split_gm, names), gen.submod_names, gen.consts
        )
        assert_close_tree(fn(*example_inputs), want)

        code, vnames, consts = vllm.generate_execution_code(split_gm)
        vfn = vllm.compile_execution_fn(code, opaque_pieces(split_gm, names), vnames, consts)
        assert_close_tree(vfn(*example_inputs), want)

        # Determinism on a real graph; serialization round trip.
        assert fxcodegen.generate(split_gm).code == gen.code
        assert fxcodegen.emit(fxcodegen.serialize(split_gm)) == (gen.code, gen.submod_names)


@pytest.mark.parametrize("spec", [OP_NAME, OP_NAME + ".default"])
def test_split_by_packet_or_overload(spec: str) -> None:
    model = Block().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        gm = make_fx(model)(x)
        split_gm, items = fxcodegen.split_graph(gm, [spec])
        assert sum(i.is_splitting_graph for i in items) == 2
        assert_close_tree(fxcodegen.build(split_gm)(x), model(x))
