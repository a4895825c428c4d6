"""The entries of a piece and what each tells the compiler.

An :class:`Entry` is one compiled variant of a piece: a range of the dispatch size (dynamic
shapes), a single size (that size baked in) or ``static`` (a piece that does not depend on
the dispatch size). What reaches the compiler for an entry is described by
:meth:`Bounds.facts` (:func:`entry_bounds`) plus the effective config patches
(:func:`entry_config`); entries with equal descriptions compile to the same thing and share
one result (``docs/piecewise.md``, "Identical compiles happen once").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from fxcodegen.example_args import fake_args, finite_int
from fxcodegen.ranges import Range

__all__ = ["Bounds", "Entry", "entry_bounds", "entry_config", "symbol_range"]


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
