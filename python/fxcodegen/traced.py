"""Facts about a graph Dynamo handed over: whether it is symbolic, which float inputs it
made symbolic, and which symbol the compile ranges apply to."""

from __future__ import annotations

import logging
from typing import Any

import torch

from fxcodegen.concrete import fake_args, is_symbolic

__all__ = ["check_range_dim", "dispatch_symbol", "has_symbols", "unspecialized_floats"]

log = logging.getLogger("fxcodegen")


def has_symbols(gm: torch.fx.GraphModule) -> bool:
    return any(is_symbolic(v) for v in fake_args(gm))


def unspecialized_floats(gm: torch.fx.GraphModule) -> list[str]:
    """The names of the float symbols Dynamo made of Python float inputs (each a 0-d tensor
    input read only by ``.item()``) that are not yet marked to be specialised."""
    from torch._dynamo.symbolic_convert import TensorifyState

    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        memo = getattr(node.meta.get("example_value"), "item_memo", None)
        name = getattr(getattr(getattr(memo, "node", None), "_expr", None), "name", None)
        if (
            isinstance(memo, torch.SymFloat)
            and isinstance(name, str)
            and node.users
            and all(u.op == "call_method" and u.target == "item" for u in node.users)
            and not TensorifyState.should_specialize(name)
        ):
            names.append(name)
    return names


def check_range_dim(range_dim: Any) -> tuple[str, int] | None:
    if range_dim is None:
        return None
    if (
        not isinstance(range_dim, (tuple, list))
        or len(range_dim) != 2
        or not isinstance(range_dim[0], str)
        or not range_dim[0].isidentifier()
        or isinstance(range_dim[1], bool)
        or not isinstance(range_dim[1], int)
    ):
        raise TypeError(
            f"range_dim must be (argument name, dimension), e.g. ('input_ids', 1), "
            f"got {range_dim!r}"
        )
    return (range_dim[0], range_dim[1])


def _source_name(node: torch.fx.Node) -> str:
    arg = node.meta.get("grapharg")
    source = getattr(arg, "source", None)
    return source.name if isinstance(getattr(source, "name", None), str) else ""


def dispatch_symbol(gm: torch.fx.GraphModule, range_dim: tuple[str, int] | None) -> Any:
    """The symbol the compile ranges apply to.

    With ``range_dim=(name, dim)``: the size of dimension ``dim`` of the input argument
    ``name``. By default: the last symbolic dimension of the first tensor input that has
    one (the sequence or token dimension of ``input_ids``, ``(batch, seq)``, and of
    ``(tokens, hidden)`` activations), else the first symbolic SymInt input.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = fake_args(gm)
    if range_dim is not None:
        name, dim = range_dim
        for node, v in zip(placeholders, values, strict=True):
            src = _source_name(node)
            if isinstance(v, torch.Tensor) and (
                src.endswith(f"['{name}']") or src.endswith(f".{name}") or node.name == name
            ):
                if not -v.dim() <= dim < v.dim():
                    raise ValueError(f"range_dim {range_dim!r}: {name} has {v.dim()} dimensions")
                size = v.shape[dim]
                if not (isinstance(size, torch.SymInt) and is_symbolic(size)):
                    log.warning(
                        "fxcodegen: range_dim %r: that size is static (%s) in this graph",
                        range_dim,
                        size,
                    )
                    return None
                return size.node.expr
        raise ValueError(f"range_dim {range_dim!r}: the graph has no tensor input {name!r}")
    for v in values:
        if isinstance(v, torch.Tensor):
            dims = [d for d in v.shape if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol]
            if dims:
                return dims[-1].node.expr
    for v in values:
        if isinstance(v, torch.SymInt) and is_symbolic(v) and v.node.expr.is_Symbol:
            return v.node.expr
    return None
