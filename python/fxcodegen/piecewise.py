"""Compile one piece of a split graph for every shape entry up front, and dispatch at run time.

A piece with symbolic inputs gets one *entry* per compile range (compiled with dynamic
shapes) and one per single compile size (compiled with static shapes from
:func:`fxcodegen.concrete_args`). A piece without symbolic inputs has a single entry. All
entries are compiled in the constructor; a call picks the entry by the runtime value of the
dynamic size (exact size first, then the range holding it, by bisection).

Identical pieces compile once: every entry has a content key (:func:`entry_key`, built on
:func:`structural_key`), and a :class:`CompiledPool` shared between pieces maps keys to
compiled results.

Artifact cache seam (used by ``fxcodegen.cache``):

- :attr:`PiecewiseBackend.entry_keys` gives each entry's content key;
  :meth:`PiecewiseBackend.export_artifacts` returns ``{key: bytes}`` for its compiled entries
  (Inductor only; :func:`inductor_artifact_bytes` does one).
- ``PiecewiseBackend(..., artifacts={key: bytes})`` loads those entries with
  :func:`load_inductor_artifact` instead of compiling them (``counters["artifact_loaded"]``);
  ``compile_missing=False`` makes a missing entry an error, so nothing is ever compiled.
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from fxcodegen.concrete import concrete_args, fake_args, is_symbolic
from fxcodegen.keys import entry_key, structural_key
from fxcodegen.ranges import Range, normalize_ranges, normalize_sizes

__all__ = [
    "COMPILERS",
    "CompiledPool",
    "Entry",
    "OutOfRangeError",
    "PiecewiseBackend",
    "inductor_artifact_bytes",
    "counters",
    "load_inductor_artifact",
]

log = logging.getLogger("fxcodegen")

counters: collections.Counter[str] = collections.Counter()
"""Process-wide counts: ``compile`` (calls into a compiler, one per distinct piece per
entry), ``compile_reused`` (piece-entries served by an identical piece's result),
``codegen`` (stitching functions generated), ``artifact_loaded`` (entries loaded from
artifact bytes). Reset with ``counters.clear()``."""

COMPILERS = ("inductor", "eager")

ALL_SIZES = Range(0, 2**63 - 1)
"""The default compile range: every size."""


class OutOfRangeError(ValueError):
    """A runtime size falls in no compiled range and is no compiled size."""


# --------------------------------------------------------------------------------------
# Entries


@dataclass(frozen=True, order=True)
class Entry:
    """One compiled variant of a piece: a range (dynamic shapes) or a single size (static),
    or ``kind="static"`` for a piece without symbolic inputs."""

    kind: str
    """``"range"``, ``"size"`` or ``"static"``."""
    start: int = 0
    end: int = 0

    @property
    def range(self) -> Range:
        return Range(self.start, self.end)

    @property
    def label(self) -> str:
        """A short stable text: ``"range:1-8"``, ``"size:16"`` or ``"static"``."""
        if self.kind == "static":
            return "static"
        if self.kind == "size":
            return f"size:{self.start}"
        return f"range:{self.start}-{self.end}"

    @classmethod
    def from_label(cls, label: str) -> Entry:
        """The entry a :attr:`label` names."""
        kind, _, rest = label.partition(":")
        try:
            if kind == "static" and not rest:
                return cls("static")
            if kind == "size":
                return cls("size", int(rest), int(rest))
            if kind == "range":
                start, _, end = rest.partition("-")
                Range(int(start), int(end))  # validates
                return cls("range", int(start), int(end))
        except ValueError:
            pass
        raise ValueError(f"not an entry label: {label!r}")

    def __str__(self) -> str:
        if self.kind == "range":
            return f"range {Range(self.start, self.end)}"
        if self.kind == "size":
            return f"size {self.start}"
        return "static"


# --------------------------------------------------------------------------------------
# Artifacts


def inductor_artifact_bytes(artifact: Any) -> bytes:
    """The bytes of an Inductor ``CompiledArtifact`` (what ``save(format="binary")`` writes)."""
    to_bytes = getattr(artifact, "_to_binary_bytes", None)
    if callable(to_bytes):
        return to_bytes()
    save = getattr(artifact, "save", None)
    if not callable(save):
        raise TypeError(f"{type(artifact).__name__} is not an Inductor CompiledArtifact")
    with tempfile.TemporaryDirectory(prefix="fxcodegen-art-") as tmp:
        path = os.path.join(tmp, "artifact.bin")
        save(path=path, format="binary")
        with open(path, "rb") as f:
            return f.read()


def load_inductor_artifact(data: bytes) -> Any:
    """Load artifact bytes from :func:`inductor_artifact_bytes` into a callable (no compiling).

    The bytes must come from the same torch build; anything else raises.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"artifact data must be bytes, got {type(data).__name__}")
    from torch._inductor import CompiledArtifact

    with tempfile.TemporaryDirectory(prefix="fxcodegen-art-") as tmp:
        path = os.path.join(tmp, "artifact.bin")
        with open(path, "wb") as f:
            f.write(bytes(data))
        return CompiledArtifact.load(path=path, format="binary")


@dataclass
class Compiled:
    """A compiled entry: the callable and, for Inductor, the artifact it came from."""

    fn: Callable[..., Any]
    artifact: Any = None
    data: bytes | None = None
    """The artifact's bytes when it was loaded from them (kept for re-export)."""

    def to_bytes(self) -> bytes:
        if self.data is None:
            if self.artifact is None:
                raise ValueError("this entry has no artifact (compiled with 'eager')")
            self.data = inductor_artifact_bytes(self.artifact)
        return self.data


class CompiledPool:
    """Compiled entries by :func:`entry_key`, shared by the pieces of one model so that
    identical pieces compile once."""

    def __init__(self) -> None:
        self._by_key: dict[str, Compiled] = {}

    def get(self, key: str) -> Compiled | None:
        return self._by_key.get(key)

    def put(self, key: str, compiled: Compiled) -> None:
        self._by_key[key] = compiled

    def __len__(self) -> int:
        return len(self._by_key)

    def copy(self) -> CompiledPool:
        """A pool with the same entries (adding to it leaves this one unchanged)."""
        out = CompiledPool()
        out._by_key = dict(self._by_key)
        return out

    def update(self, other: CompiledPool) -> None:
        """Add ``other``'s entries."""
        self._by_key.update(other._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key


def _free_symbols(examples: Sequence[Any]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for v in examples:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            out |= v.node.expr.free_symbols
        elif isinstance(v, torch.Tensor) and v.layout == torch.strided:
            for d in (*v.shape, *v.stride(), v.storage_offset()):
                if isinstance(d, torch.SymInt):
                    out |= d.node.expr.free_symbols
    return out


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


def _returns_sequence(gm: torch.fx.GraphModule) -> bool:
    for node in reversed(gm.graph.nodes):
        if node.op == "output":
            return isinstance(node.args[0], (tuple, list))
    return False


def _wrap_inductor(fn: Callable[..., Any], returns_sequence: bool) -> Callable[..., Any]:
    # Inductor artifacts return a list; a piece that returns one value gets it unwrapped.
    if returns_sequence:
        return fn

    def single(*args: Any) -> Any:
        return fn(*args)[0]

    return single


# --------------------------------------------------------------------------------------
# The backend for one piece


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
            entry (single-size entries of such a piece are compiled with dynamic shapes).
        compiler: ``"inductor"`` (``torch._inductor.standalone_compile``), ``"eager"``
            (runs the graph as is), or a callable ``compiler(graph, entry, example_args)``
            returning the entry's callable (example args: symbolic for ranges and static
            pieces, concrete FakeTensors for single sizes). Custom compilers are keyed by
            identity, so they share results only within one process.
        name: used in logs and errors.
        pool: a :class:`CompiledPool` shared with identical pieces (default: a private one).
        artifacts: ``{entry key: bytes}`` from an earlier :meth:`export_artifacts`; entries
            found there are loaded instead of compiled.
        compile_missing: with ``False``, an entry neither pooled nor in ``artifacts``
            raises ``KeyError`` instead of compiling.
        inductor_config: Inductor config patches (``options={"config_patches": ...}``).
        on_entry: called as ``on_entry(entry, how)`` after each entry, ``how`` one of
            ``"compiled"``, ``"reused"``, ``"loaded"`` (progress reporting).
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
        inductor_config: Mapping[str, Any] | None = None,
        on_entry: Callable[[Entry, str], None] | None = None,
        dispatch_symbol: sympy.Symbol | None = None,
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
        self.inductor_config = dict(inductor_config or {})

        examples = fake_args(graph)
        self._dispatch_dim: int | None = None
        if sym_shape_indices is None:
            sym_shape_indices, self._dispatch_dim = _dispatch_location(examples, dispatch_symbol)
        for i in sym_shape_indices:
            if not 0 <= i < len(examples):
                raise ValueError(
                    f"sym_shape_indices entry {i} is out of range for {len(examples)} inputs"
                )
        self.sym_shape_indices = list(sym_shape_indices)
        symbols = _free_symbols(examples)
        self.dispatch_symbol = dispatch_symbol
        self._other_symbols = bool(symbols - {dispatch_symbol}) if dispatch_symbol else False
        """Whether the piece has symbolic sizes besides the dispatch one (its single-size
        entries then keep those dynamic)."""

        if self.sym_shape_indices:
            ranges = normalize_ranges([ALL_SIZES] if compile_ranges is None else compile_ranges)
            sizes = normalize_sizes(compile_sizes)
            if not ranges and not sizes:
                raise ValueError("a symbolic piece needs at least one compile range or size")
            entries = [Entry("range", r.start, r.end) for r in ranges]
            entries += [Entry("size", s, s) for s in sizes]
        else:
            entries = [Entry("static")]
        self.entries: list[Entry] = entries

        self.struct_key = structural_key(graph)
        self.entry_keys: dict[Entry, str] = {
            e: entry_key(self.struct_key, e, compiler_id, self.inductor_config) for e in entries
        }

        pool = pool if pool is not None else CompiledPool()
        self._compiled: dict[Entry, Compiled] = {}
        returns_sequence = _returns_sequence(graph)
        self.returns_tuple = returns_sequence
        for entry in entries:
            key = self.entry_keys[entry]
            compiled = pool.get(key)
            if compiled is not None:
                counters["compile_reused"] += 1
                how = "reused"
            elif artifacts is not None and key in artifacts:
                data = bytes(artifacts[key])
                t0 = time.perf_counter()
                art = load_inductor_artifact(data)
                compiled = Compiled(_wrap_inductor(art, returns_sequence), art, data)
                counters["artifact_loaded"] += 1
                log.debug(
                    "loaded %s [%s] in %.3fs", self.piece_name, entry, time.perf_counter() - t0
                )
                pool.put(key, compiled)
                how = "loaded"
            elif not compile_missing:
                raise KeyError(
                    f"no artifact for {self.piece_name} [{entry}] (key {key}) and "
                    "compile_missing=False"
                )
            else:
                t0 = time.perf_counter()
                compiled = self._compile(entry, returns_sequence)
                counters["compile"] += 1
                log.debug(
                    "compiled %s [%s] with %s in %.3fs",
                    self.piece_name,
                    entry,
                    compiler_id,
                    time.perf_counter() - t0,
                )
                pool.put(key, compiled)
                how = "compiled"
            self._compiled[entry] = compiled
            if on_entry is not None:
                on_entry(entry, how)

        # Dispatch tables.
        self._single: Callable[..., Any] | None = None
        self._dispatch_index = self.sym_shape_indices[0] if self.sym_shape_indices else -1
        self._exact: dict[int, Callable[..., Any]] = {}
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._range_fns: list[Callable[..., Any]] = []
        for entry in entries:
            fn = self._compiled[entry].fn
            if entry.kind == "static":
                # object.__setattr__: an eager entry is a GraphModule, which nn.Module would
                # register as a child and serve through its slow __getattr__.
                object.__setattr__(self, "_single", fn)
            elif entry.kind == "size":
                self._exact[entry.start] = fn
            else:
                self._starts.append(entry.start)
                self._ends.append(entry.end)
                self._range_fns.append(fn)

    # compiling -------------------------------------------------------------------------
    def _compile(self, entry: Entry, returns_sequence: bool) -> Compiled:
        if self.compiler == "eager":
            return Compiled(self.graph)
        if callable(self.compiler):
            if entry.kind == "size" and not self._other_symbols:
                example = concrete_args(self.graph, entry.start, fake=True)
            else:
                example = fake_args(self.graph)
            fn = self.compiler(self.graph, entry, example)
            if not callable(fn):
                raise TypeError(
                    f"compiler {self.compiler!r} returned {type(fn).__name__}, not a callable"
                )
            return Compiled(fn)
        from torch._inductor import standalone_compile
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        options = {"config_patches": dict(self.inductor_config)}
        if entry.kind == "size" and not self._other_symbols:
            mode = FakeTensorMode(shape_env=ShapeEnv())
            args = concrete_args(self.graph, entry.start, fake=True, fake_mode=mode)
            art = standalone_compile(
                self.graph,
                args,
                dynamic_shapes="from_example_inputs",
                options=options,
                fake_mode=mode,
            )
        else:
            art = standalone_compile(
                self.graph, fake_args(self.graph), dynamic_shapes="from_graph", options=options
            )
        return Compiled(_wrap_inductor(art, returns_sequence), art)

    # calling ---------------------------------------------------------------------------
    def entry_for(self, size: int | None) -> Entry:
        """The entry a call with dynamic size ``size`` runs (``None`` for a static piece)."""
        if self._single is not None:
            return self.entries[0]
        if size in self._exact:
            return Entry("size", size, size)  # type: ignore[arg-type]
        i = bisect.bisect_right(self._starts, size) - 1  # type: ignore[arg-type]
        if i >= 0 and size <= self._ends[i]:  # type: ignore[operator]
            return Entry("range", self._starts[i], self._ends[i])
        raise self._out_of_range(size)

    def _out_of_range(self, size: Any) -> OutOfRangeError:
        ranges = ", ".join(str(Range(s, e)) for s, e in zip(self._starts, self._ends, strict=True))
        sizes = ", ".join(map(str, sorted(self._exact))) or "none"
        return OutOfRangeError(
            f"{self.piece_name}: size {size!r} (argument {self._dispatch_index}"
            + ("" if self._dispatch_dim is None else f", dim {self._dispatch_dim}")
            + ") is in no "
            f"compiled range and is no compiled size; ranges: {ranges or 'none'}; sizes: {sizes}"
        )

    def forward(self, *args: Any) -> Any:
        single = self._single
        if single is not None:
            return single(*args)
        size = args[self._dispatch_index]
        if self._dispatch_dim is not None:
            size = size.size(self._dispatch_dim)
        fn = self._exact.get(size)
        if fn is None:
            i = bisect.bisect_right(self._starts, size) - 1
            if i < 0 or size > self._ends[i]:
                raise self._out_of_range(size)
            fn = self._range_fns[i]
        return fn(*args)

    # cache seam ------------------------------------------------------------------------
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
