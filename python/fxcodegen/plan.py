"""The plan of one piece, made once: its entries, where a call's size is read, and for each
entry the config patches, what the compiler is told and the two keys.

Everything downstream reads the plan: the cache key (the structural key and, with a
callable ``inductor_config``, each entry's patches), the cooperative compile (one work item
per sharing key), obtaining each entry (load, compile, reuse or share) and the piece's
dispatch tables. Nothing here compiles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from fxcodegen.compile_entry import returns_sequence
from fxcodegen.entries import Bounds, Entry, entry_bounds, entry_config, symbol_range
from fxcodegen.example_args import fake_args, is_symbolic
from fxcodegen.fingerprint import compile_key, entry_key, structural_key_stable
from fxcodegen.graph_inputs import RangeDim, static_entry
from fxcodegen.ranges import ALL_SIZES, normalize_ranges, normalize_sizes

__all__ = ["COMPILERS", "EntryPlan", "InductorConfig", "PiecePlan", "plan_entries", "plan_piece"]

COMPILERS = ("inductor", "eager")

InductorConfig = Mapping[str, Any] | Callable[[Entry], Mapping[str, Any]] | None


def _dispatch_location(
    examples: Sequence[Any], symbol: sympy.Symbol | None
) -> tuple[list[int], int | None]:
    """Where a call's dynamic size is read: ``([argument index], None)`` for a SymInt
    argument, ``([argument index], dim)`` for a tensor argument's size, ``([], None)`` when
    the piece does not depend on it. Without a ``symbol``, every symbolic SymInt argument
    (dispatch reads the first)."""
    syms = [i for i, v in enumerate(examples) if isinstance(v, torch.SymInt) and is_symbolic(v)]
    if symbol is None:
        return syms, None
    exact = [i for i in syms if examples[i].node.expr == symbol]
    if exact:
        return exact, None
    for i, v in enumerate(examples):
        if isinstance(v, torch.Tensor):
            for d, n in enumerate(v.shape):
                if isinstance(n, torch.SymInt) and n.node.expr == symbol:
                    return [i], d
    return [], None


def plan_entries(
    graph: torch.fx.GraphModule,
    *,
    compile_ranges: Iterable[Any] | None = None,
    compile_sizes: Iterable[int] = (),
    sym_shape_indices: Sequence[int] | None = None,
    dispatch_symbol: sympy.Symbol | RangeDim | None = None,
) -> tuple[list[Entry], list[int], int | None, sympy.Symbol | None]:
    """The entries of ``graph`` and where a call's size is read: ``(entries,
    sym_shape_indices, dispatch dim, dispatch symbol)``."""
    if isinstance(dispatch_symbol, RangeDim):
        if dispatch_symbol.symbol is None:
            # Static in this graph (or absent): one entry, nothing read at call time; the
            # other symbolic sizes stay dynamic in it.
            if dispatch_symbol.size is None:
                return [Entry("static")], [], None, None
            return [static_entry(dispatch_symbol, compile_ranges, compile_sizes)], [], None, None
        dispatch_symbol = dispatch_symbol.symbol
    examples = fake_args(graph)
    dim: int | None = None
    if sym_shape_indices is None:
        sym_shape_indices, dim = _dispatch_location(examples, dispatch_symbol)
    for i in sym_shape_indices:
        if not 0 <= i < len(examples):
            raise ValueError(
                f"sym_shape_indices entry {i} is out of range for {len(examples)} inputs"
            )
    indices = list(sym_shape_indices)
    if dispatch_symbol is None and indices and dim is None:
        v = examples[indices[0]]
        if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
            dispatch_symbol = v.node.expr
    if indices:
        ranges = normalize_ranges([ALL_SIZES] if compile_ranges is None else compile_ranges)
        sizes = normalize_sizes(compile_sizes)
        if not ranges and not sizes:
            raise ValueError("a symbolic piece needs at least one compile range or size")
        entries = [Entry("range", r.start, r.end) for r in ranges]
        entries += [Entry("size", n, n) for n in sizes]
    else:
        entries = [Entry("static")]
    return entries, indices, dim, dispatch_symbol


@dataclass(frozen=True)
class EntryPlan:
    """How one entry of a piece is compiled and keyed."""

    entry: Entry
    config: dict[str, Any]
    """The Inductor config patches it is compiled with."""
    bounds: Bounds | None
    """What its compile is told about the dispatch size (``None``: nothing, a static piece)."""
    key: str
    """Its content key (:func:`fxcodegen.fingerprint.entry_key`): what the cache stores it under."""
    compile_key: str
    """Its sharing key (:func:`fxcodegen.fingerprint.compile_key`): equal keys compile once."""


@dataclass(frozen=True)
class PiecePlan:
    """What one piece will hold and how each of its entries is obtained."""

    name: str
    graph: torch.fx.GraphModule
    compiler: str | Callable[..., Any]
    compiler_id: str
    """The compiler's name, or ``custom:<qualified name>:<id>`` for a callable."""
    struct_key: str
    """The piece's :func:`fxcodegen.fingerprint.structural_key`."""
    stable: bool
    """False when ``struct_key`` holds an object identity (valid in this process only)."""
    entries: tuple[EntryPlan, ...]
    sym_shape_indices: tuple[int, ...]
    dispatch_dim: int | None
    symbol: sympy.Symbol | None
    dispatch_arg: str
    """The argument (and dimension) a call's size is read from, as errors name it."""
    returns_tuple: bool

    @property
    def labels(self) -> list[str]:
        return [e.entry.label for e in self.entries]


def _compiler_id(compiler: str | Callable[..., Any]) -> str:
    if callable(compiler):
        qual = getattr(compiler, "__qualname__", type(compiler).__qualname__)
        return f"custom:{getattr(compiler, '__module__', '?')}.{qual}:{id(compiler)}"
    if compiler in COMPILERS:
        return compiler
    raise ValueError(f"unknown compiler {compiler!r}; choose one of {COMPILERS} or pass a callable")


def plan_piece(
    graph: torch.fx.GraphModule,
    *,
    name: str = "piece",
    compiler: str | Callable[..., Any] = "inductor",
    compile_ranges: Iterable[Any] | None = None,
    compile_sizes: Iterable[int] = (),
    inductor_config: InductorConfig = None,
    dispatch_symbol: sympy.Symbol | RangeDim | None = None,
    sym_shape_indices: Sequence[int] | None = None,
) -> PiecePlan:
    """The :class:`PiecePlan` of ``graph`` (see :class:`fxcodegen.PiecewiseBackend` for the
    arguments). Calls a callable ``inductor_config`` once per entry."""
    if not isinstance(graph, torch.fx.GraphModule):
        raise TypeError(f"PiecewiseBackend expects a GraphModule, got {type(graph).__name__}")
    compiler_id = _compiler_id(compiler)
    entries, indices, dim, symbol = plan_entries(
        graph,
        compile_ranges=compile_ranges,
        compile_sizes=compile_sizes,
        sym_shape_indices=sym_shape_indices,
        dispatch_symbol=dispatch_symbol,
    )
    if isinstance(dispatch_symbol, RangeDim):
        dispatch_arg = f"{dispatch_symbol.arg}, dim {dispatch_symbol.dim}"
    else:
        dispatch_arg = f"argument {indices[0] if indices else -1}" + (
            "" if dim is None else f", dim {dim}"
        )
    struct, stable = structural_key_stable(graph)
    traced = symbol_range(graph, symbol) if symbol is not None else (0, None)
    plans = []
    for e in entries:
        config = entry_config(inductor_config, e)
        bounds = entry_bounds(e, traced) if symbol is not None else None
        facts = None if bounds is None else bounds.facts()
        plans.append(
            EntryPlan(
                e,
                config,
                bounds,
                entry_key(struct, e, compiler_id, config),
                compile_key(struct, facts, compiler_id, config),
            )
        )
    return PiecePlan(
        name=name,
        graph=graph,
        compiler=compiler,
        compiler_id=compiler_id,
        struct_key=struct,
        stable=stable,
        entries=tuple(plans),
        sym_shape_indices=tuple(indices),
        dispatch_dim=dim,
        symbol=symbol,
        dispatch_arg=dispatch_arg,
        returns_tuple=returns_sequence(graph),
    )
