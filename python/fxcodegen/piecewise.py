"""Compile one piece of a split graph for every shape entry up front, and dispatch at run time.

A piece with symbolic inputs gets one *entry* per compile range (compiled with dynamic
shapes, the dispatch size bounded to the range) and one per single compile size (that size
baked in); a piece that does not depend on the dispatch size has a single entry, and so
does a piece of a graph where it is static (the entry covering its value). All entries are
compiled in the constructor (:func:`fxcodegen.entries.compile_entry`); a call picks the
entry by the runtime value of the dispatch size (exact size first, then the range holding
it, by bisection).

Identical compiles happen once: every entry has a sharing key (:func:`compile_key`: the
piece's :func:`structural_key`, what the compiler is told about the dispatch size, the
compiler and its config patches), and a :class:`CompiledPool` shared between pieces maps
keys to compiled results.

Artifact cache seam (used by ``fxcodegen.cache``):

- :attr:`PiecewiseBackend.entry_keys` gives each entry's content key (:func:`entry_key`);
  :meth:`PiecewiseBackend.export_artifacts` returns ``{key: bytes}`` for its compiled entries
  (Inductor only; :func:`inductor_artifact_bytes` does one).
- ``PiecewiseBackend(..., artifacts={key: bytes})`` loads those entries with
  :func:`load_inductor_artifact` instead of compiling them (``counters["artifact_loaded"]``);
  ``compile_missing=False`` makes a missing entry an error, so nothing is ever compiled.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sympy
import torch

from fxcodegen import torch_trace
from fxcodegen.concrete import fake_args, is_symbolic
from fxcodegen.entries import (
    Bounds,
    Compiled,
    CompiledPool,
    Entry,
    compile_entry,
    entry_bounds,
    entry_config,
    inductor_artifact_bytes,
    load_inductor_artifact,
    returns_sequence,
    symbol_range,
    wrap_inductor,
)
from fxcodegen.keys import compile_key, entry_key, structural_key
from fxcodegen.ranges import (
    ALL_SIZES,
    OutOfRangeError,
    SizeTable,
    normalize_ranges,
    normalize_sizes,
)
from fxcodegen.traced import RangeDim, static_entry

__all__ = [
    "COMPILERS",
    "Compiled",
    "CompiledPool",
    "Entry",
    "EntrySpec",
    "OutOfRangeError",
    "PiecewiseBackend",
    "counters",
    "entry_specs",
    "inductor_artifact_bytes",
    "load_inductor_artifact",
    "plan_entries",
]

log = logging.getLogger("fxcodegen")

counters: collections.Counter[str] = collections.Counter()
"""Process-wide counts: ``compile`` (calls into a compiler), ``compile_reused``
(piece-entries served by an identical piece's result), ``compile_shared`` (entries served
by another entry of the same piece that the compiler is given the same for),
``artifact_loaded`` (entries loaded from artifact bytes), ``codegen`` (stitching functions
generated). Reset with ``counters.clear()``."""

COMPILERS = ("inductor", "eager")


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


# --------------------------------------------------------------------------------------
# The backend for one piece


def plan_entries(
    graph: torch.fx.GraphModule,
    *,
    compile_ranges: Iterable[Any] | None = None,
    compile_sizes: Iterable[int] = (),
    sym_shape_indices: Sequence[int] | None = None,
    dispatch_symbol: sympy.Symbol | RangeDim | None = None,
) -> tuple[list[Entry], list[int], int | None, sympy.Symbol | None]:
    """What a :class:`PiecewiseBackend` of ``graph`` will hold, without compiling:
    ``(entries, sym_shape_indices, dispatch dim, dispatch symbol)``."""
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


@dataclasses.dataclass(frozen=True)
class EntrySpec:
    """How one entry is compiled and keyed."""

    config: dict[str, Any]
    """The Inductor config patches it is compiled with."""
    bounds: Bounds | None
    """What its compile is told about the dispatch size (``None``: nothing, a static piece)."""
    key: str
    """Its content key (:func:`entry_key`): what the artifact cache stores it under."""
    compile_key: str
    """Its sharing key (:func:`compile_key`): entries with equal keys compile once."""


def entry_specs(
    graph: torch.fx.GraphModule,
    entries: Sequence[Entry],
    symbol: sympy.Symbol | None,
    compiler_id: str,
    inductor_config: Mapping[str, Any] | Callable[[Entry], Mapping[str, Any]] | None,
    struct: str | None = None,
) -> dict[Entry, EntrySpec]:
    """The :class:`EntrySpec` of each of ``entries`` (from :func:`plan_entries`);
    ``struct`` is the graph's :func:`structural_key` when known."""
    struct = struct or structural_key(graph)
    traced = symbol_range(graph, symbol) if symbol is not None else (0, None)
    specs = {}
    for e in entries:
        config = entry_config(inductor_config, e)
        bounds = entry_bounds(e, traced) if symbol is not None else None
        specs[e] = EntrySpec(
            config,
            bounds,
            entry_key(struct, e, compiler_id, config),
            compile_key(struct, None if bounds is None else bounds.facts(), compiler_id, config),
        )
    return specs


class PiecewiseBackend(torch.nn.Module):
    """One piece, compiled for all its entries at construction; calling it dispatches.

    Args:
        graph: the piece (a GraphModule whose placeholders carry example values).
        compile_ranges: ranges compiled with dynamic shapes (``Range`` or ``(start, end)``;
            must not overlap). ``None`` means one range covering every size.
        compile_sizes: single sizes compiled with static shapes; checked before ranges.
        sym_shape_indices: argument positions holding the dynamic size (SymInt inputs);
            ``None`` finds them from the placeholders. Dispatch reads the first one. With
            none, the piece has a single (static) entry and ranges/sizes are ignored.
        dispatch_symbol: the symbol the ranges and sizes apply to (when
            ``sym_shape_indices`` is ``None``): dispatch reads the SymInt argument equal to
            it, else the tensor argument dimension of that size. A piece that does not
            depend on it has a single entry; its other symbolic sizes stay dynamic in every
            entry. Default: the symbol of the first ``sym_shape_indices`` argument. A
            :class:`~fxcodegen.traced.RangeDim` also names the size in errors; when it is
            static in the graph, the piece has the one entry covering it.
        compiler: ``"inductor"`` (``torch._inductor.standalone_compile``), ``"eager"``
            (runs the graph as is), or a callable ``compiler(graph, entry, example_args)``
            returning the entry's callable (example args: the inputs Inductor would get,
            in the entry's own ShapeEnv). Custom compilers are keyed by identity, so they
            share results only within one process.
        name: used in logs and errors.
        pool: a :class:`CompiledPool` shared with identical pieces (default: a private one).
        artifacts: ``{entry key: bytes}`` from an earlier :meth:`export_artifacts`; entries
            found there are loaded instead of compiled.
        compile_missing: with ``False``, an entry neither pooled nor in ``artifacts``
            raises ``KeyError`` instead of compiling.
        inductor_config: Inductor config patches (``options={"config_patches": ...}``), or
            a callable ``entry -> dict`` giving each entry its own.
        on_entry: called as ``on_entry(entry, how)`` after each entry, ``how`` one of
            ``"compiled"``, ``"reused"``, ``"shared"``, ``"loaded"`` (progress reporting).
        before_entry: called as ``before_entry(entry)`` before each entry.
    """

    def __init__(
        self,
        graph: torch.fx.GraphModule,
        *,
        compile_ranges: Iterable[Any] | None = None,
        compile_sizes: Iterable[int] = (),
        sym_shape_indices: Sequence[int] | None = None,
        compiler: str | Callable[..., Any] = "inductor",
        name: str | None = None,
        pool: CompiledPool | None = None,
        artifacts: Mapping[str, bytes] | None = None,
        compile_missing: bool = True,
        inductor_config: Mapping[str, Any] | Callable[[Entry], Mapping[str, Any]] | None = None,
        on_entry: Callable[[Entry, str], None] | None = None,
        dispatch_symbol: sympy.Symbol | RangeDim | None = None,
        before_entry: Callable[[Entry], None] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(graph, torch.fx.GraphModule):
            raise TypeError(f"PiecewiseBackend expects a GraphModule, got {type(graph).__name__}")
        if callable(compiler):
            compiler_id = (
                f"custom:{getattr(compiler, '__module__', '?')}."
                f"{getattr(compiler, '__qualname__', type(compiler).__qualname__)}:{id(compiler)}"
            )
        elif compiler in COMPILERS:
            compiler_id = compiler
        else:
            raise ValueError(
                f"unknown compiler {compiler!r}; choose one of {COMPILERS} or pass a callable"
            )
        self.graph = graph
        self.piece_name = name or "piece"
        self.compiler = compiler
        entries, indices, self._dispatch_dim, symbol = plan_entries(
            graph,
            compile_ranges=compile_ranges,
            compile_sizes=compile_sizes,
            sym_shape_indices=sym_shape_indices,
            dispatch_symbol=dispatch_symbol,
        )
        self.sym_shape_indices = indices
        self._dispatch_arg = (
            f"{dispatch_symbol.arg}, dim {dispatch_symbol.dim}"
            if isinstance(dispatch_symbol, RangeDim)
            else f"argument {indices[0] if indices else -1}"
            + ("" if self._dispatch_dim is None else f", dim {self._dispatch_dim}")
        )
        self.dispatch_symbol = symbol
        self.entries: list[Entry] = entries
        self.struct_key = structural_key(graph)
        specs = entry_specs(graph, entries, symbol, compiler_id, inductor_config, self.struct_key)
        self.entry_configs: dict[Entry, dict[str, Any]] = {e: s.config for e, s in specs.items()}
        """The Inductor config patches each entry is compiled with."""
        self.bounds: dict[Entry, Bounds | None] = {e: s.bounds for e, s in specs.items()}
        """What each entry's compile is told about the dispatch size."""
        self.entry_keys: dict[Entry, str] = {e: s.key for e, s in specs.items()}
        self.compile_keys: dict[Entry, str] = {e: s.compile_key for e, s in specs.items()}
        """Each entry's sharing key (what reaches the compiler); equal keys share."""

        pool = pool if pool is not None else CompiledPool()
        self._compiled: dict[Entry, Compiled] = {}
        self.how: dict[Entry, str] = {}
        """How each entry was obtained: compiled, reused, shared or loaded."""
        self.entry_seconds: dict[Entry, float] = {}
        """Seconds spent compiling or loading each entry (0 for reused and shared)."""
        sequence = returns_sequence(graph)
        self.returns_tuple = sequence
        seen: set[str] = set()  # sharing keys this piece already holds
        for entry in entries:
            if before_entry is not None:
                before_entry(entry)
            key = self.compile_keys[entry]
            compiled = pool.get(key)
            t0 = time.perf_counter()
            seconds = 0.0  # spent compiling or loading it
            if compiled is not None and key in seen:
                how = "shared"
                counters["compile_shared"] += 1
            elif compiled is not None and not compiled.claimed:
                # compiled for this piece ahead of it (cooperative compile): counted then
                compiled.claimed, seconds = True, compiled.seconds
                how = "compiled"
            elif compiled is not None:
                how = "reused"
                counters["compile_reused"] += 1
            elif artifacts is not None and self.entry_keys[entry] in artifacts:
                data = bytes(artifacts[self.entry_keys[entry]])
                with torch_trace.phase(
                    "fxcodegen.load_entry", piece=self.piece_name, entry=entry.label
                ):
                    art = load_inductor_artifact(data)
                compiled = Compiled(wrap_inductor(art, sequence), art, data)
                counters["artifact_loaded"] += 1
                pool.put(key, compiled)
                how, seconds = "loaded", time.perf_counter() - t0
            elif not compile_missing:
                raise KeyError(
                    f"no artifact for {self.piece_name} [{entry}] (key "
                    f"{self.entry_keys[entry]}) and compile_missing=False"
                )
            else:
                with torch_trace.phase(
                    "fxcodegen.compile_entry", piece=self.piece_name, entry=entry.label
                ):
                    compiled = compile_entry(
                        graph,
                        compiler=compiler,
                        symbol=symbol,
                        bounds=self.bounds[entry],
                        config=self.entry_configs[entry],
                        entry=entry,
                        name=self.piece_name,
                    )
                counters["compile"] += 1
                pool.put(key, compiled)
                how, seconds = "compiled", time.perf_counter() - t0
            log.debug(
                "%s %s [%s] (%s) with %s in %.3fs",
                how,
                self.piece_name,
                entry,
                self.bounds[entry] or "static",
                compiler_id,
                seconds,
            )
            seen.add(key)
            self._compiled[entry] = compiled
            self.how[entry] = how
            self.entry_seconds[entry] = seconds
            if on_entry is not None:
                on_entry(entry, how)

        # Dispatch tables.
        self._single: Callable[..., Any] | None = None
        self._dispatch_index = self.sym_shape_indices[0] if self.sym_shape_indices else -1
        self._table = SizeTable(self.piece_name, self._dispatch_arg)
        for entry in entries:
            fn = self._compiled[entry].fn
            if not self.sym_shape_indices:  # one entry, whatever its kind: no dispatch
                # object.__setattr__: an eager entry is a GraphModule, which nn.Module would
                # register as a child and serve through its slow __getattr__.
                object.__setattr__(self, "_single", fn)
            elif entry.kind == "size":
                self._table.add_size(entry.start, fn)
            else:
                self._table.add_range(entry.start, entry.end, fn)

    # calling ---------------------------------------------------------------------------
    def entry_for(self, size: int | None) -> Entry:
        """The entry a call with dynamic size ``size`` runs (``None`` for a static piece)."""
        if self._single is not None:
            return self.entries[0]
        if size in self._table.exact:
            return Entry("size", size, size)  # type: ignore[arg-type]
        i = self._table.index(size)
        return Entry("range", self._table.starts[i], self._table.ends[i])

    def forward(self, *args: Any) -> Any:
        single = self._single
        if single is not None:
            return single(*args)
        size = args[self._dispatch_index]
        if self._dispatch_dim is not None:
            size = size.size(self._dispatch_dim)
        return self._table.lookup(size)(*args)

    # cache seam ------------------------------------------------------------------------
    @property
    def dispatch_dim(self) -> int | None:
        """The dimension of the ``sym_shape_indices[0]`` tensor argument a call's size is
        read from (``None``: that argument is the size itself, or nothing is read)."""
        return self._dispatch_dim

    @property
    def exportable(self) -> bool:
        """Whether :meth:`export_artifacts` can give bytes (Inductor entries only)."""
        return self.compiler == "inductor"

    def export_artifacts(self) -> dict[str, bytes]:
        """``{entry key: artifact bytes}`` for every entry (Inductor only).

        Feed the result back as ``PiecewiseBackend(..., artifacts=...)`` in a later process
        (same torch build) to skip compiling. Raises ``ValueError`` for ``"eager"`` and
        ``RuntimeError`` when Inductor produced no saveable artifact (caches disabled).
        """
        if not self.exportable:
            raise ValueError(f"compiler {self.compiler!r} produces no artifacts to export")
        return {self.entry_keys[e]: self._compiled[e].to_bytes() for e in self.entries}

    def extra_repr(self) -> str:
        entries = ", ".join(map(str, self.entries))
        return f"{self.piece_name}, compiler={self.compiler!r}, entries=[{entries}]"
