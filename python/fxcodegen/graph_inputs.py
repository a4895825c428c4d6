"""Facts about a graph Dynamo handed over: whether it is symbolic, which float inputs it
made symbolic, and which size the compile ranges apply to (its range dimension)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import sympy
import torch

from fxcodegen.entries import Entry
from fxcodegen.example_args import fake_args, is_symbolic
from fxcodegen.ranges import ALL_SIZES, OutOfRangeError, normalize_ranges, normalize_sizes

__all__ = [
    "RangeDim",
    "check_range_dim",
    "dispatch_symbol",
    "has_symbols",
    "static_entry",
    "unspecialized_floats",
]


@dataclasses.dataclass(frozen=True)
class RangeDim:
    """The size the compile ranges apply to in one graph: dimension ``dim`` of the input
    ``arg`` (named as the caller wrote it, e.g. ``input_ids``; ``None``: the graph has no
    tensor input, and then no size is dispatched on)."""

    arg: str | None
    dim: int
    symbol: sympy.Expr | None = None
    """Its symbol, when the size is symbolic in the graph."""
    size: int | None = None
    """Its value, when the size is static in the graph (one token per decode step)."""

    def __str__(self) -> str:
        if self.arg is None:
            return "none"
        value = self.symbol if self.symbol is not None else self.size
        return f"{self.arg} dim {self.dim} = {value}"


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


def _arg_name(node: torch.fx.Node) -> str:
    """The input's name as the caller wrote it: ``input_ids`` for ``L['input_ids']`` and
    ``L['kwargs']['input_ids']``; else its whole source, else the placeholder's name."""
    src = _source_name(node)
    m = re.fullmatch(r"L\['(\w+)'\](?:\['(\w+)'\])?", src)
    return (m.group(2) or m.group(1)) if m else src or node.name


def _is_user_input(node: torch.fx.Node) -> bool:
    """Whether a placeholder is an argument of the call rather than a module's parameter,
    buffer or attribute, or a global (Dynamo lifts those to inputs too)."""
    from torch._dynamo import source as sources

    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:  # a graph built by hand: every input is the caller's
        return True
    if not sources.is_from_local_source(source):
        return False
    while source is not None:
        if isinstance(
            source,
            (
                sources.NNModuleSource,
                sources.ParamBufferSource,
                sources.UnspecializedParamBufferSource,
            ),
        ):
            return False
        source = getattr(source, "base", None)
    return True


def _token_dim(v: torch.Tensor) -> int:
    # Token ids, (batch, tokens), end in the tokens; activations and embeddings,
    # (batch, tokens, hidden) or (tokens, hidden), have the hidden size after them.
    if v.dim() == 1 or not (v.dtype.is_floating_point or v.dtype.is_complex):
        return v.dim() - 1
    return v.dim() - 2


def _range_dim(arg: str, dim: int, size: Any) -> RangeDim:
    if isinstance(size, torch.SymInt) and is_symbolic(size):
        return RangeDim(arg, dim, symbol=size.node.expr)
    return RangeDim(arg, dim, size=int(size))


def dispatch_symbol(
    gm: torch.fx.GraphModule,
    range_dim: tuple[str, int] | None,
    compile_ranges: Iterable[Any] | None = None,
    compile_sizes: Iterable[int] = (),
) -> RangeDim:
    """The size the compile ranges apply to in ``gm`` (its *range dimension*).

    With ``range_dim=(name, dim)``: dimension ``dim`` of the input argument ``name``. By
    default: the tokens of the first tensor argument of the call (parameters, buffers and
    globals that Dynamo made inputs do not count): the last dimension of an integer tensor
    (``input_ids``, ``(batch, tokens)``), the one before the last of a floating one
    (``inputs_embeds``, ``(batch, tokens, hidden)``, or ``(tokens, hidden)`` activations).
    No other size is ever chosen. When the size is static in ``gm`` (one token per decode
    step), it must be a compile size or lie in a compile range: else ``OutOfRangeError``.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = fake_args(gm)
    found: RangeDim | None = None
    if range_dim is not None:
        name, dim = range_dim
        for node, v in zip(placeholders, values, strict=True):
            src = _source_name(node)
            if isinstance(v, torch.Tensor) and (
                src.endswith(f"['{name}']") or src.endswith(f".{name}") or node.name == name
            ):
                if not -v.dim() <= dim < v.dim():
                    raise ValueError(f"range_dim {range_dim!r}: {name} has {v.dim()} dimensions")
                found = _range_dim(name, dim, v.shape[dim])
                break
        else:
            raise ValueError(f"range_dim {range_dim!r}: the graph has no tensor input {name!r}")
    else:
        for node, v in zip(placeholders, values, strict=True):
            if isinstance(v, torch.Tensor) and v.dim() > 0 and _is_user_input(node):
                dim = _token_dim(v)
                found = _range_dim(_arg_name(node), dim, v.shape[dim])
                break
        else:
            return RangeDim(None, 0)
    if found.size is not None:
        static_entry(found, compile_ranges, compile_sizes)  # raises when nothing covers it
    return found


def static_entry(
    rd: RangeDim, compile_ranges: Iterable[Any] | None, compile_sizes: Iterable[int]
) -> Entry:
    """The entry of every piece of a graph whose range dimension is static: the compile
    size equal to it, else the compile range holding it."""
    size = rd.size
    assert size is not None
    sizes = normalize_sizes(compile_sizes)
    if size in sizes:
        return Entry("size", size, size)
    ranges = normalize_ranges([ALL_SIZES] if compile_ranges is None else compile_ranges)
    for r in ranges:
        if size in r:
            return Entry("range", r.start, r.end)
    raise OutOfRangeError(
        f"{rd.arg}, dim {rd.dim}, is {size} in this graph, which is in no compile range and is "
        f"no compile size; ranges: {', '.join(map(str, ranges)) or 'none'}; sizes: "
        f"{', '.join(map(str, sizes)) or 'none'}"
    )
