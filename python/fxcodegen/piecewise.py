"""One piece of a split graph: compiled for every shape entry up front, dispatching at run time.

A piece with symbolic inputs gets one *entry* per compile range (compiled with dynamic
shapes, the dispatch size bounded to the range) and one per single compile size (that size
baked in); a piece that does not depend on the dispatch size has a single entry, and so
does a piece of a graph where it is static (the entry covering its value). A call picks the
entry by the runtime value of the dispatch size (exact size first, then the range holding
it, by bisection).

The backend's pipeline plans a piece (:mod:`fxcodegen.plan`), obtains its entries
(:mod:`fxcodegen.obtain`) and builds it with :meth:`PiecewiseBackend.from_plan`, which only
binds the dispatch tables. Constructed directly, ``PiecewiseBackend(graph, ...)`` runs
those two steps itself and adds its counts to :data:`counters`.

Identical compiles happen once: every entry has a sharing key
(:func:`fxcodegen.fingerprint.compile_key`: the piece's structural key, what the compiler is told
about the dispatch size, the compiler and its config patches), and a :class:`CompiledPool`
shared between pieces maps keys to compiled results. ``artifacts={entry key: bytes}``
(from :meth:`PiecewiseBackend.export_artifacts`) loads those entries instead of compiling
them; ``compile_missing=False`` makes a missing entry an error, so nothing is compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sympy
import torch

from fxcodegen.cache import PieceRecord
from fxcodegen.compile_entry import Compiled
from fxcodegen.entries import Bounds, Entry
from fxcodegen.graph_inputs import RangeDim
from fxcodegen.obtain import CompiledPool, Obtained, counters, obtain_piece, tally
from fxcodegen.plan import COMPILERS, InductorConfig, PiecePlan, plan_entries, plan_piece
from fxcodegen.ranges import OutOfRangeError, SizeTable

__all__ = [
    "COMPILERS",
    "Compiled",
    "CompiledPool",
    "Entry",
    "OutOfRangeError",
    "PiecewiseBackend",
    "counters",
    "plan_entries",
]


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
            :class:`~fxcodegen.graph_inputs.RangeDim` also names the size in errors; when it is
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
        inductor_config: InductorConfig = None,
        on_entry: Callable[[Entry, str], None] | None = None,
        dispatch_symbol: sympy.Symbol | RangeDim | None = None,
        before_entry: Callable[[Entry], None] | None = None,
    ) -> None:
        super().__init__()
        plan = plan_piece(
            graph,
            name=name or "piece",
            compiler=compiler,
            compile_ranges=compile_ranges,
            compile_sizes=compile_sizes,
            inductor_config=inductor_config,
            dispatch_symbol=dispatch_symbol,
            sym_shape_indices=sym_shape_indices,
        )
        obtained = obtain_piece(
            plan,
            pool=pool if pool is not None else CompiledPool(),
            artifacts=artifacts,
            compile_missing=compile_missing,
            before_entry=before_entry,
            on_entry=on_entry,
        )
        counters.update(tally([obtained]))
        self._bind(plan, obtained)

    @classmethod
    def from_plan(cls, plan: PiecePlan, obtained: Mapping[Entry, Obtained]) -> PiecewiseBackend:
        """The piece of ``plan`` with its entries obtained already (nothing is compiled)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self._bind(plan, obtained)
        return self

    def _bind(self, plan: PiecePlan, obtained: Mapping[Entry, Obtained]) -> None:
        self.plan = plan
        self.graph = plan.graph
        self.piece_name = plan.name
        self.compiler = plan.compiler
        self.struct_key = plan.struct_key
        self.sym_shape_indices = list(plan.sym_shape_indices)
        self.dispatch_symbol = plan.symbol
        self.returns_tuple = plan.returns_tuple
        self.entries: list[Entry] = [ep.entry for ep in plan.entries]
        self.entry_configs: dict[Entry, dict[str, Any]] = {
            ep.entry: ep.config for ep in plan.entries
        }
        """The Inductor config patches each entry is compiled with."""
        self.bounds: dict[Entry, Bounds | None] = {ep.entry: ep.bounds for ep in plan.entries}
        """What each entry's compile is told about the dispatch size."""
        self.entry_keys: dict[Entry, str] = {ep.entry: ep.key for ep in plan.entries}
        self.compile_keys: dict[Entry, str] = {ep.entry: ep.compile_key for ep in plan.entries}
        """Each entry's sharing key (what reaches the compiler); equal keys share."""
        self._compiled: dict[Entry, Compiled] = {e: o.compiled for e, o in obtained.items()}
        self.how: dict[Entry, str] = {e: o.how for e, o in obtained.items()}
        """How each entry was obtained: compiled, reused, shared or loaded."""
        self.entry_seconds: dict[Entry, float] = {e: o.seconds for e, o in obtained.items()}
        """Seconds spent compiling or loading each entry (0 for reused and shared)."""

        self._single: Callable[..., Any] | None = None
        self._dispatch_index = self.sym_shape_indices[0] if self.sym_shape_indices else -1
        self._dispatch_dim = plan.dispatch_dim
        self._table = SizeTable(self.piece_name, plan.dispatch_arg)
        for entry in self.entries:
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
        return self.plan.dispatch_dim

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

    def piece_record(self) -> PieceRecord:
        """What the cache stores for this piece: its entries' artifacts and what a load
        without a trace needs to dispatch (:class:`fxcodegen.stored_graph.StoredPiece`).
        Raises as :meth:`export_artifacts` does."""
        exported = self.export_artifacts()
        return PieceRecord(
            name=self.piece_name,
            entries={e.label: exported[self.entry_keys[e]] for e in self.entries},
            sym_shape_indices=tuple(self.sym_shape_indices),
            returns_tuple=self.returns_tuple,
            compile_ranges=tuple((e.start, e.end) for e in self.entries if e.kind == "range"),
            compile_sizes=tuple(e.start for e in self.entries if e.kind == "size"),
            extra={"struct_key": self.struct_key, "dispatch_dim": self.dispatch_dim},
        )

    def extra_repr(self) -> str:
        entries = ", ".join(map(str, self.entries))
        return f"{self.piece_name}, compiler={self.compiler!r}, entries=[{entries}]"
