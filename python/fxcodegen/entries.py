"""Entries of a piece and how one entry is compiled.

An :class:`Entry` is one compiled variant of a piece: a range of the dispatch size (dynamic
shapes), a single size (that size baked in) or ``static`` (a piece that does not depend on
the dispatch size). :func:`compile_entry` compiles one: it re-creates the piece's inputs in
a fresh ShapeEnv (:func:`fxcodegen.concrete.fresh_args`) where the dispatch symbol is
bounded to the entry's range with a size hint inside it (:class:`Bounds`), re-propagates
the graph's metadata there and hands the copy to Inductor. Nothing Inductor adds to that
ShapeEnv reaches Dynamo's, or another entry's.

What reaches Inductor for an entry is described by :meth:`Bounds.facts` plus the effective
config patches (:func:`entry_config`); entries with equal descriptions compile to the same
thing and share one result (``docs/piecewise.md``, "Identical compiles happen once").
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from fxcodegen.concrete import fake_args, finite_int, fresh_args
from fxcodegen.ranges import Range

__all__ = [
    "Bounds",
    "Compiled",
    "Entry",
    "compile_entry",
    "entry_bounds",
    "entry_config",
    "inductor_artifact_bytes",
    "load_inductor_artifact",
    "returns_sequence",
    "unproven_guards",
    "wrap_inductor",
]

log = logging.getLogger("fxcodegen")


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
# What an entry tells the compiler


@dataclass(frozen=True)
class Bounds:
    """What a compile is told about the dispatch symbol: its value (``lo == hi``) or its
    inclusive value range and size hint (``hi`` ``None``: unbounded above)."""

    lo: int
    hi: int | None
    hint: int

    @property
    def is_value(self) -> bool:
        return self.hi == self.lo

    def facts(self) -> list[Any]:
        """A JSON-able description (what the sharing key covers)."""
        if self.is_value:
            return ["value", self.lo]
        return ["range", self.lo, self.hi, self.hint]

    def __str__(self) -> str:
        if self.is_value:
            return f"= {self.lo}"
        return f"in [{self.lo}, {'oo' if self.hi is None else self.hi}] (hint {self.hint})"


def _hint_in(lo: int, hi: int | None) -> int:
    # The point of the range nearest to the size Inductor assumes for a size it knows
    # nothing about (unbacked_symint_fallback, 8192): ranges below it are tuned for their
    # largest size (the one that costs most), ranges above it for their smallest, and an
    # unbounded range gets Inductor's own default.
    import torch._inductor.config as inductor_config

    target = int(getattr(inductor_config, "unbacked_symint_fallback", 8192))
    return max(lo, target if hi is None else min(hi, target))


def symbol_range(graph: torch.fx.GraphModule, symbol: sympy.Symbol) -> tuple[int, int | None]:
    """The value range the traced graph gives ``symbol`` (``None``: unbounded above)."""
    for v in fake_args(graph):
        dims = [*v.shape] if isinstance(v, torch.Tensor) else [v]
        for d in dims:
            if isinstance(d, torch.SymInt) and symbol in d.node.expr.free_symbols:
                vr = d.node.shape_env.var_to_range.get(symbol)
                if vr is None:
                    break
                lo = finite_int(vr.lower)
                return (0 if lo is None else lo), finite_int(vr.upper)
    return 0, None


def entry_bounds(entry: Entry, traced: tuple[int, int | None]) -> Bounds | None:
    """The :class:`Bounds` a compile of ``entry`` gets, given the symbol's traced range
    (``None`` for a static entry). A range entry is bounded to its range narrowed to the
    traced one (Dynamo traces a symbolic graph only for sizes >= 2: sizes 0 and 1 get their
    own static graph); a range outside the traced one (it never reaches this graph) gets
    the traced range."""
    if entry.kind == "static":
        return None
    if entry.kind == "size":
        return Bounds(entry.start, entry.start, entry.start)
    t_lo, t_hi = traced
    lo = max(entry.start, t_lo)
    hi = entry.end if t_hi is None else min(entry.end, t_hi)
    if lo > hi:  # unreachable in this graph
        lo, hi = t_lo, t_hi
    if hi is not None and hi >= 2**62:  # the default range: every size
        hi = t_hi
    return Bounds(lo, hi, _hint_in(lo, hi))


def entry_config(
    inductor_config: Mapping[str, Any] | Callable[[Entry], Mapping[str, Any]] | None,
    entry: Entry,
) -> dict[str, Any]:
    """The Inductor config patches ``entry`` is compiled with: ``inductor_config`` itself,
    or, when it is callable, ``inductor_config(entry)``."""
    if inductor_config is None:
        return {}
    if callable(inductor_config):
        patches = inductor_config(entry)
        if patches is None:
            return {}
        if not isinstance(patches, Mapping):
            raise TypeError(
                f"inductor_config({entry.label!r}) returned {type(patches).__name__}, "
                "not a dict of Inductor config patches"
            )
        return dict(patches)
    return dict(inductor_config)


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


def returns_sequence(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm``'s output is a tuple or list (else a single value)."""
    for node in reversed(gm.graph.nodes):
        if node.op == "output":
            return isinstance(node.args[0], (tuple, list))
    return False


def wrap_inductor(fn: Callable[..., Any], sequence: bool) -> Callable[..., Any]:
    """Inductor artifacts return a list; a piece that returns one value gets it unwrapped."""
    if sequence:
        return fn

    def single(*args: Any) -> Any:
        return fn(*args)[0]

    return single


# --------------------------------------------------------------------------------------
# Compiling one entry


def _retraced(graph: torch.fx.GraphModule, args: list[Any], mode: Any) -> torch.fx.GraphModule:
    """A copy of ``graph`` whose metadata (``val``, ``example_value``) is propagated from
    ``args`` in ``mode``: passes that read it (Inductor's pre-grad passes) then evaluate
    sizes in the entry's ShapeEnv, not in Dynamo's."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    new_graph = torch.fx.Graph()
    out = new_graph.graph_copy(graph.graph, {})
    new_graph.output(out)
    gm = torch.fx.GraphModule(graph, new_graph)
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
        node.meta.pop("example_value", None)
        node.meta.pop("tensor_meta", None)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*args)
    for node in gm.graph.nodes:
        if node.op != "output" and "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    return gm


def unproven_guards(env: Any, symbol: sympy.Symbol, lo: int, hi: int | None) -> list[str]:
    """The guards in ``env`` on ``symbol`` that ``lo <= symbol <= hi`` does not prove (a
    compile that added them relied on something true at the size hint only). The range is
    passed in: adding a guard narrows the ShapeEnv's own range to fit it."""
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    ranges = dict(env.var_to_range)
    ranges[symbol] = ValueRanges(lo, int_oo if hi is None else hi)
    out = []
    for guard in getattr(env, "guards", []):
        expr = guard.expr
        if symbol not in expr.free_symbols:
            continue
        try:
            vr = bound_sympy(expr, ranges)
            proven = vr.is_singleton() and bool(vr.lower)
        except Exception:  # noqa: BLE001 - an expression it cannot bound is not proven
            proven = False
        if not proven:
            out.append(str(expr))
    return out


def compile_entry(
    graph: torch.fx.GraphModule,
    *,
    compiler: str | Callable[..., Any],
    symbol: sympy.Symbol | None,
    bounds: Bounds | None,
    config: Mapping[str, Any],
    entry: Entry,
    name: str,
) -> Compiled:
    """Compile ``graph`` for one entry (see the module docstring)."""
    sequence = returns_sequence(graph)
    if compiler == "eager":
        return Compiled(graph)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    symbols: dict[sympy.Symbol, sympy.Expr] = {}
    if symbol is None or bounds is None:
        args = fresh_args(graph, mode, symbols_out=symbols)
    elif bounds.is_value:
        args = fresh_args(graph, mode, values={symbol: bounds.lo}, symbols_out=symbols)
    else:
        args = fresh_args(
            graph,
            mode,
            bounds={symbol: (bounds.lo, bounds.hi)},
            hints={symbol: bounds.hint},
            symbols_out=symbols,
        )
    if callable(compiler):
        fn = compiler(graph, entry, args)
        if not callable(fn):
            raise TypeError(f"compiler {compiler!r} returned {type(fn).__name__}, not a callable")
        return Compiled(fn)

    from torch._inductor import standalone_compile

    gm = _retraced(graph, args, mode)
    art = standalone_compile(
        gm,
        args,
        dynamic_shapes="from_example_inputs",
        options={"config_patches": dict(config)},
        fake_mode=mode,
        donate_graph_module=True,
    )
    new = symbols.get(symbol) if symbol is not None else None
    if isinstance(new, sympy.Symbol) and bounds is not None:
        unproven = unproven_guards(mode.shape_env, new, bounds.lo, bounds.hi)
        if unproven:
            log.warning(
                "fxcodegen: %s [%s]: Inductor's code assumes %s: true at the size hint, "
                "not proven for the whole range %s",
                name,
                entry,
                " and ".join(unproven),
                bounds,
            )
    return Compiled(wrap_inductor(art, sequence), art)
