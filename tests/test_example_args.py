from __future__ import annotations

import pytest
import torch
from _piecewise_helpers import capture, graph_with_examples, symbolic_env
from fxcodegen import concrete_args
from fxcodegen.example_args import fake_args, is_symbolic
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode


def _symbolic_examples() -> list[object]:
    """Examples over one symbol s (hint 5): expressions, a non-contiguous view, an offset."""
    _, mode, s = symbolic_env(5)
    with mode:
        contiguous = torch.empty(2 * s + 1, 4, dtype=torch.float16)  # [2s+1, 4] stride (4, 1)
        base = torch.empty(s + 3, 6, dtype=torch.int64)
        transposed = base.t()  # [6, s+3], stride (1, 6): non-contiguous
        offset_view = base[2:, 1::2]  # offset 2*6+1 = 13, shape [s+1, 3], stride (6, 2)
        sym_offset = base[s:]  # storage offset 6*s: symbolic
        grad = torch.empty(s, requires_grad=True)
    return [contiguous, transposed, offset_view, sym_offset, s, 2 * s + 1, 7, "mode", None, grad]


def test_fake_args_reads_example_value_then_val() -> None:
    a = torch.empty(2)
    g = torch.fx.Graph()
    p0, p1 = g.placeholder("x"), g.placeholder("y")
    p0.meta["example_value"] = a
    p1.meta["val"] = 3
    g.output((p0, p1))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert fake_args(gm)[0] is a and fake_args(gm)[1] == 3


def test_fake_args_missing_example_names_the_placeholder() -> None:
    g = torch.fx.Graph()
    g.output(g.placeholder("lonely"))
    with pytest.raises(ValueError, match="'lonely'"):
        fake_args(torch.fx.GraphModule(torch.nn.Module(), g))


def test_concrete_args_fake_replaces_every_symbol() -> None:
    gm = graph_with_examples(_symbolic_examples())
    out = concrete_args(gm, 3)
    contiguous, transposed, offset_view, sym_offset, s, expr, seven, mode, none, grad = out

    assert all(isinstance(t, FakeTensor) for t in (contiguous, transposed, offset_view, grad))
    # the result lives in one fresh mode, not the symbolic one
    assert contiguous.fake_mode is transposed.fake_mode
    assert not any(is_symbolic(v) for v in out)

    assert contiguous.shape == (7, 4) and contiguous.stride() == (4, 1)
    assert contiguous.dtype == torch.float16
    assert transposed.shape == (6, 6) and transposed.stride() == (1, 6)
    assert transposed.dtype == torch.int64
    assert offset_view.shape == (4, 3) and offset_view.stride() == (6, 2)
    assert offset_view.storage_offset() == 13
    assert sym_offset.shape == (3, 6) and sym_offset.storage_offset() == 18
    assert (s, expr, seven, mode, none) == (3, 7, 7, "mode", None)
    assert type(s) is int and type(expr) is int
    assert grad.requires_grad and grad.shape == (3,)
    assert not contiguous.requires_grad


def test_concrete_args_real_tensors_own_exactly_the_needed_storage() -> None:
    gm = graph_with_examples(_symbolic_examples())
    out = concrete_args(gm, 4, fake=False)
    contiguous, transposed, offset_view, sym_offset = out[:4]
    for t in out[:4]:
        assert type(t) is torch.Tensor and t.device.type == "cpu"
    assert offset_view.shape == (5, 3) and offset_view.storage_offset() == 13
    # elements reached: offset 13 + (5-1)*6 + (3-1)*2 + 1 = 42
    assert offset_view.untyped_storage().nbytes() == 42 * 8
    assert sym_offset.storage_offset() == 24 and sym_offset.shape == (3, 6)
    assert sym_offset.untyped_storage().nbytes() == (24 + 2 * 6 + 5 + 1) * 8
    assert transposed.shape == (6, 7) and transposed.stride() == (1, 6)
    # the views are usable: write through them and read back
    offset_view.fill_(3)
    assert int(offset_view.sum()) == 3 * 15
    transposed.copy_(torch.arange(42).reshape(6, 7))
    assert transposed[5, 6].item() == 41
    assert contiguous.shape == (9, 4)


def test_concrete_args_with_meta_val_and_given_mode() -> None:
    _, mode, s = symbolic_env(6)
    with mode:
        t = torch.empty(s, 2)
    gm = graph_with_examples([t, s], meta_key="val")
    mine = FakeTensorMode()
    out = concrete_args(gm, 10, fake_mode=mine)
    assert out[0].fake_mode is mine and out[0].shape == (10, 2) and out[1] == 10


def test_concrete_args_on_a_dynamo_graph() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.t() * 2, y[1:] + 1

    cap = capture(f, (torch.randn(5, 7)[:, :4], torch.randn(6)))
    gm = cap.graphs[0]
    assert any(is_symbolic(v) for v in fake_args(gm))
    out = concrete_args(gm, 11, fake=False)
    assert not any(is_symbolic(v) for v in out)
    tensors = [v for v in out if isinstance(v, torch.Tensor)]
    assert {tuple(t.shape) for t in tensors} == {(11, 11), (11,)}
    # the graph runs on the concrete arguments
    gm(*out)


def test_concrete_args_bad_input() -> None:
    gm = graph_with_examples([3])
    with pytest.raises(ValueError, match=">= 0"):
        concrete_args(gm, -1)
    with pytest.raises(TypeError, match="size must be an int"):
        concrete_args(gm, True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fake_mode"):
        concrete_args(gm, 2, fake=False, fake_mode=FakeTensorMode())
    with pytest.raises(TypeError, match="GraphModule"):
        concrete_args(torch.nn.Linear(2, 2), 2)  # type: ignore[arg-type]
    assert concrete_args(gm, 2) == [3]
