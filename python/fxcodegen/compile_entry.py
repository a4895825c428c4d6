"""Compiling one entry of a piece, and the compiled result's artifact bytes.

:func:`compile_entry` re-creates the piece's inputs in a fresh ShapeEnv
(:func:`fxcodegen.example_args.fresh_args`) where the dispatch symbol is bounded to the
entry's range with a size hint inside it (:class:`~fxcodegen.entries.Bounds`), re-propagates
the graph's metadata there and hands the copy to Inductor. Nothing Inductor adds to that
ShapeEnv reaches Dynamo's, or another entry's.
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

from fxcodegen.entries import Bounds, Entry
from fxcodegen.example_args import fresh_args

__all__ = [
    "Compiled",
    "compile_entry",
    "inductor_artifact_bytes",
    "load_inductor_artifact",
    "returns_sequence",
    "unproven_guards",
    "wrap_inductor",
]

log = logging.getLogger("fxcodegen")


# --------------------------------------------------------------------------------------
# Artifacts


def inductor_artifact_bytes(artifact: Any) -> bytes:
    """The bytes of an Inductor ``CompiledArtifact`` (what ``save(format="binary")`` writes)."""
    # Inductor's cache-backed artifacts give their bytes directly (a private method);
    # the other kinds only save to a file.
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
        except Exception:  # an expression it cannot bound is not proven
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
