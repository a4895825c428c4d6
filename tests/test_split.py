from __future__ import annotations

import operator

import pytest
import torch
from _piecewise_helpers import ATTENTION, capture
from fxcodegen import split_graph
from fxcodegen.split import SplitItem, dense_in_order
from fxcodegen.toy import attention, make_decoder

aten = torch.ops.aten


def _compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def _outputs_are_tuples(gm: torch.fx.GraphModule) -> bool:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return isinstance(out.args[0], tuple)


@pytest.fixture(scope="module")
def decoder_capture():
    model = make_decoder(num_layers=3, hidden=16, heads=2)
    return model, capture(model, (torch.randn(6, 16),))


def test_split_toy_decoder_alternates_pieces(decoder_capture) -> None:
    model, cap = decoder_capture
    gm = cap.graphs[0]
    split_gm, items = split_graph(gm, [ATTENTION])
    assert [it.is_splitting_graph for it in items] == [False, True] * 3 + [False]
    assert [it.graph_id for it in items] == list(range(7))
    assert [it.submod_name for it in items] == [f"submod_{i}" for i in range(7)]
    for it in items:
        assert isinstance(it, SplitItem)
        assert it.graph is split_gm.get_submodule(it.submod_name)
        assert _outputs_are_tuples(it.graph)
        if it.is_splitting_graph:
            # the op, then the layout its example value promises (dense_in_order)
            node, layout = _compute_nodes(it.graph)
            assert node.target in (attention, attention.default)
            assert layout.target is dense_in_order and layout.args[0] is node
        else:
            assert all(
                n.target not in (attention, attention.default) for n in _compute_nodes(it.graph)
            )
    # calls appear in original order
    calls = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    assert calls == [it.submod_name for it in items]
    # the split graph computes what the original does
    _, args = cap.calls[0]
    torch.testing.assert_close(split_gm(*args), gm(*args))


def test_split_by_overload_name_matches_packet_with_single_overload(decoder_capture) -> None:
    _, cap = decoder_capture
    _, items = split_graph(cap.graphs[0], [ATTENTION + ".default"])
    assert sum(it.is_splitting_graph for it in items) == 3


def _traced(fn) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(fn)


def test_consecutive_splitting_ops_share_a_piece_and_getitems_stay() -> None:
    def f(x):
        a = x * 2
        values, indices = aten.topk.default(a, 2)  # a tuple-returning splitting op
        s = aten.sort.default(values)  # consecutive splitting op
        b = s[0] + 1
        return b, indices

    gm = _traced(f)
    split_gm, items = split_graph(gm, ["aten::topk", "aten::sort"])
    assert [it.is_splitting_graph for it in items] == [False, True, False]
    middle = _compute_nodes(items[1].graph)
    targets = [n.target for n in middle]
    assert aten.topk.default in targets and aten.sort.default in targets
    # getitems on topk's result live in the splitting piece, right after their producer
    assert sum(t is operator.getitem for t in targets) >= 2
    # `s[0]` is a getitem on a splitting op: it stays in the splitting piece too
    assert all(n.target is not operator.getitem for n in _compute_nodes(items[2].graph))
    x = torch.randn(3, 5)
    torch.testing.assert_close(split_gm(x), gm(x))


def test_split_at_start_and_end_and_overload_specific() -> None:
    def f(x):
        y = aten.relu.default(x)
        z = y * 3
        return aten.sigmoid.default(z)

    gm = _traced(f)
    split_gm, items = split_graph(gm, ["aten::relu.default", "aten::sigmoid"])
    assert [it.is_splitting_graph for it in items] == [True, False, True]
    x = torch.randn(4)
    torch.testing.assert_close(split_gm(x), gm(x))
    # a different overload of relu does not split
    _, items = split_graph(gm, ["aten::relu.out"])
    assert [it.is_splitting_graph for it in items] == [False]


def test_split_packet_target_and_no_splitting_ops() -> None:
    def f(q, k, v):
        return attention(q * 2, k, v, 2) + 1  # symbolic_trace records the packet

    gm = _traced(f)
    assert any(n.target is attention for n in gm.graph.nodes)
    split_gm, items = split_graph(gm, [ATTENTION])
    assert [it.is_splitting_graph for it in items] == [False, True, False]
    q, k, v = (torch.randn(3, 4) for _ in range(3))
    torch.testing.assert_close(split_gm(q, k, v), gm(q, k, v))

    split_gm, items = split_graph(gm, [])
    assert len(items) == 1 and not items[0].is_splitting_graph
    torch.testing.assert_close(split_gm(q, k, v), gm(q, k, v))


@pytest.mark.parametrize(
    ("ops", "exc", "match"),
    [
        (["nope_ns::missing"], ValueError, "unknown splitting op 'nope_ns::missing'"),
        (["aten::definitely_not_an_op"], ValueError, "unknown splitting op"),
        (["aten::relu.no_such_overload"], ValueError, "no overload 'no_such_overload'"),
        (["relu"], ValueError, "nor a dotted name"),
        (["torch.nn.functional.no_such_fn"], ValueError, "no such module attribute"),
        (["torch.float32"], TypeError, "splitting op must be"),
        (["aten::relu."], ValueError, "not of the form"),
        (ATTENTION, TypeError, "not a single string"),
        ([42], TypeError, "splitting op must be"),
    ],
)
def test_split_bad_op_names(ops, exc, match) -> None:
    gm = _traced(lambda x: x + 1)
    with pytest.raises(exc, match=match):
        split_graph(gm, ops)


def test_split_accepts_op_objects_and_rejects_non_graphs() -> None:
    gm = _traced(lambda x: aten.relu.default(x) + 1)
    _, items = split_graph(gm, [aten.relu.default])
    assert [it.is_splitting_graph for it in items] == [True, False]
    with pytest.raises(TypeError, match="GraphModule"):
        split_graph(torch.nn.Linear(2, 2), [ATTENTION])  # type: ignore[arg-type]


def test_a_scalar_used_across_pieces_is_recomputed_where_it_is_used() -> None:
    def f(x, k):
        s = k * 2.0  # a Python scalar computed before the splitting op...
        y = aten.relu.default(x + 1)
        return y * s, x - s  # ...and used after it (and before it)

    gm = _traced(f)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["example_value"] = torch.randn(3) if node.name == "x" else 3.0
        elif node.target is operator.mul and node.args[0].name == "k":
            node.meta["example_value"] = 6.0
    x = torch.randn(3)
    want = f(x, 3.0)
    split_gm, items = split_graph(gm, ["aten::relu"])
    assert [it.is_splitting_graph for it in items] == [False, True, False]
    for it in items:  # every piece returns nodes, none of them the scalar
        out = next(n for n in it.graph.graph.nodes if n.op == "output")
        assert all(v.target is not operator.mul or v.args[0].name != "k" for v in out.args[0])
    last = [n for n in items[-1].graph.graph.nodes if n.op == "call_function"]
    assert any(n.target is operator.mul and n.args[1] == 2.0 for n in last)
    torch.testing.assert_close(split_gm(x, 3.0), want)


def test_dense_in_order_copies_only_a_tensor_laid_out_otherwise() -> None:
    from fxcodegen.split import dense_in_order

    x = torch.randn(2, 3, 4)
    assert dense_in_order(x, (2, 1, 0)) is x  # contiguous is innermost-last
    t = torch.randn(2, 4, 3).transpose(1, 2)  # what CPU attention returns
    fixed = dense_in_order(t, (2, 1, 0))
    assert fixed.is_contiguous() and fixed.data_ptr() != t.data_ptr()
    torch.testing.assert_close(fixed, t)
    assert dense_in_order(t, (1, 2, 0)) is t


def test_tensors_leaving_a_splitting_piece_get_the_layout_of_their_example_value() -> None:
    from fxcodegen.split import dense_in_order

    def f(x):
        y = aten.relu.default(x)
        return y + 1

    gm = _traced(f)
    for node in gm.graph.nodes:
        if node.op != "output":
            node.meta["example_value"] = torch.empty(2, 3)
    _, items = split_graph(gm, ["aten::relu"])
    splitting = next(it for it in items if it.is_splitting_graph)
    targets = [n.target for n in splitting.graph.graph.nodes if n.op == "call_function"]
    assert targets == [aten.relu.default, dense_in_order]
