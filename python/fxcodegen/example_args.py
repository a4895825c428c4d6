"""Example arguments for a piece: its placeholders' example values, symbolic or concrete.

:func:`fake_args` returns the placeholders' example values as traced (FakeTensors and
SymInts). :func:`concrete_args` returns the same values with every symbol replaced by one
size: the inputs a piece sees at that size, used to compile it for a single size.
"""

from __future__ import annotations

import contextlib
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.numbers import int_oo

__all__ = [
    "concrete_args",
    "concrete_value",
    "fake_args",
    "finite_int",
    "fresh_args",
    "is_symbolic",
]

_MISSING = object()


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"expected a torch.fx.GraphModule, got {type(gm).__name__}")
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def fake_args(gm: torch.fx.GraphModule) -> list[Any]:
    """The example values of ``gm``'s placeholders, in order.

    Reads ``meta["example_value"]`` (Dynamo), falling back to ``meta["val"]`` (make_fx /
    AOTAutograd). A placeholder with neither raises ``ValueError`` naming it.
    """
    out = []
    for node in _placeholders(gm):
        value = node.meta.get("example_value", _MISSING)
        if value is _MISSING:
            value = node.meta.get("val", _MISSING)
        if value is _MISSING:
            raise ValueError(
                f"placeholder {node.name!r} (target {node.target!r}) has no example value: "
                "neither meta['example_value'] nor meta['val'] is set; trace the graph with "
                "Dynamo or make_fx first"
            )
        out.append(value)
    return out


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` depends on a symbol: a SymInt/SymFloat/SymBool with free symbols,
    or a tensor with such a size, stride or storage offset. (A SymInt whose expression is a
    constant, which Dynamo produces for specialised sizes, is not symbolic.)"""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return bool(value.node.expr.free_symbols)
    if isinstance(value, torch.Tensor):
        dims = [*value.shape]
        if value.layout == torch.strided:
            dims += [*value.stride(), value.storage_offset()]
        return any(is_symbolic(d) for d in dims)
    return False


def _concrete_expr(expr: sympy.Expr, size: int, what: str) -> sympy.Expr:
    symbols = expr.free_symbols
    if symbols:
        expr = expr.xreplace({s: sympy.Integer(size) for s in symbols})
    if expr.free_symbols:  # pragma: no cover - xreplace removes every free symbol
        raise ValueError(f"{what} {expr} stays symbolic after substituting {size}")
    return expr


def _concrete_int(value: Any, size: int, what: str) -> int:
    if isinstance(value, torch.SymInt):
        expr = _concrete_expr(value.node.expr, size, what)
        if not expr.is_integer:
            raise ValueError(f"{what} {value.node.expr} is not an integer at size {size}: {expr}")
        return int(expr)
    return int(value)


def concrete_value(value: Any, size: int, *, fake_mode: FakeTensorMode | None = None) -> Any:
    """One example value with every symbol replaced by ``size`` (see :func:`concrete_args`).

    Tensors are created under ``fake_mode`` when given (FakeTensors), else as real tensors.
    """
    if isinstance(value, torch.SymInt):
        return _concrete_int(value, size, "SymInt")
    if isinstance(value, torch.SymFloat):
        return float(_concrete_expr(value.node.expr, size, "SymFloat"))
    if isinstance(value, torch.SymBool):
        return bool(_concrete_expr(value.node.expr, size, "SymBool"))
    if isinstance(value, torch.Tensor):
        return _concrete_tensor(value, size, fake_mode)
    return value


def _concrete_tensor(t: torch.Tensor, size: int, fake_mode: FakeTensorMode | None) -> torch.Tensor:
    if t.layout != torch.strided:
        raise ValueError(f"concrete_args supports strided tensors only, got layout {t.layout}")
    shape = [_concrete_int(d, size, "size") for d in t.shape]
    stride = [_concrete_int(d, size, "stride") for d in t.stride()]
    offset = _concrete_int(t.storage_offset(), size, "storage offset")
    if any(d < 0 for d in shape) or any(s < 0 for s in stride) or offset < 0:
        raise ValueError(
            f"tensor at size {size} has a negative size, stride or offset: "
            f"shape={shape} stride={stride} storage_offset={offset}"
        )
    # Elements the view reaches: offset + the furthest element + 1 (nothing when empty).
    if all(d > 0 for d in shape):
        needed = offset + 1 + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
    else:
        needed = offset
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        base = torch.empty_strided((needed,), (1,), dtype=t.dtype, device=t.device)
        out = base.as_strided(shape, stride, offset)
    if t.requires_grad:
        out = out.detach().requires_grad_(True)
    return out


def concrete_args(
    gm: torch.fx.GraphModule,
    size: int,
    *,
    fake: bool = True,
    fake_mode: FakeTensorMode | None = None,
) -> list[Any]:
    """``gm``'s example arguments with every symbol replaced by ``size``.

    Every symbol in every SymInt (sizes, strides, storage offsets, scalar SymInt inputs;
    expressions such as ``2*s0 + 1`` included) becomes ``size``. Tensors are made with
    ``torch.empty_strided`` on the original dtype and device, allocating what the view
    needs and viewing it at the original (concretised) storage offset. ``fake=True`` gives
    FakeTensors (no memory), created in ``fake_mode`` or a fresh mode with a ShapeEnv;
    ``fake=False`` gives real, uninitialised tensors. Non-tensor, non-symbolic values pass
    through unchanged.
    """
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type(size).__name__} {size!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if fake_mode is not None and not fake:
        raise ValueError("fake_mode is only meaningful with fake=True")
    mode = None
    if fake:
        mode = fake_mode if fake_mode is not None else FakeTensorMode(shape_env=ShapeEnv())
    return [concrete_value(v, size, fake_mode=mode) for v in fake_args(gm)]


def _symbols_in_order(values: list[Any]) -> list[sympy.Symbol]:
    """The free symbols of ``values`` (sizes, strides, offsets, scalars), in order of
    appearance."""
    seen: dict[sympy.Symbol, None] = {}

    def add(v: Any) -> None:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            for s in sorted(v.node.expr.free_symbols, key=str):
                seen.setdefault(s, None)

    for v in values:
        if isinstance(v, torch.Tensor) and v.layout == torch.strided:
            for d in (*v.shape, *v.stride(), v.storage_offset()):
                add(d)
        else:
            add(v)
    return list(seen)


def _source_env(values: list[Any]) -> Any:
    for v in values:
        dims = [*v.shape, *v.stride()] if isinstance(v, torch.Tensor) else [v]
        for d in dims:
            if isinstance(d, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return d.node.shape_env
    return None


def finite_int(bound: Any) -> int | None:
    """A value-range bound as an int, ``None`` for an infinite one."""
    if bound in (int_oo, -int_oo, sympy.oo, -sympy.oo):
        return None
    return int(bound)


def fresh_args(
    gm: torch.fx.GraphModule,
    fake_mode: FakeTensorMode,
    *,
    values: dict[sympy.Symbol, int] | None = None,
    bounds: dict[sympy.Symbol, tuple[int, int]] | None = None,
    hints: dict[sympy.Symbol, int] | None = None,
    symbols_out: dict[sympy.Symbol, sympy.Expr] | None = None,
) -> list[Any]:
    """``gm``'s example arguments re-created in ``fake_mode`` (which must have its own
    ShapeEnv), so that whatever a compiler adds to that ShapeEnv (guards, replacements,
    narrowed ranges) never reaches the one the graph was traced in.

    Each symbol of the traced arguments becomes: the integer ``values[s]``, or a new
    symbol of ``fake_mode``'s ShapeEnv whose value range is the traced range narrowed to
    ``bounds[s]`` (inclusive) and whose size hint is ``hints[s]`` (default: the traced
    hint). A narrowed range that is empty raises ``ValueError``.
    """
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    env = fake_mode.shape_env
    if env is None:
        raise ValueError("fresh_args needs a FakeTensorMode with a ShapeEnv")
    values, bounds, hints = dict(values or {}), dict(bounds or {}), dict(hints or {})
    examples = fake_args(gm)
    old_env = _source_env(examples)
    mapping: dict[sympy.Symbol, sympy.Expr] = {}
    new_hints: dict[sympy.Symbol, int] = {}
    for s in _symbols_in_order(examples):
        if s in values:
            mapping[s] = sympy.Integer(values[s])
            new_hints[s] = int(values[s])
            continue
        old_range = old_env.var_to_range.get(s) if old_env is not None else None
        lo = finite_int(old_range.lower) if old_range is not None else None
        lo = 0 if lo is None else lo
        hi = finite_int(old_range.upper) if old_range is not None else None
        if s in bounds:
            lo = max(lo, bounds[s][0])
            hi = bounds[s][1] if hi is None else min(hi, bounds[s][1])
        if hi is not None and lo > hi:
            raise ValueError(f"symbol {s}: the range [{lo}, {hi}] is empty")
        hint = hints.get(s)
        if hint is None:
            hint = old_env.var_to_val.get(s) if old_env is not None else None
            hint = lo if hint is None else int(hint)
        hint = max(lo, hint if hi is None else min(hi, hint))
        new = env.create_symbol(
            hint,
            ConstantSource(f"fxcodegen_{s}"),
            dynamic_dim=DimDynamic.DYNAMIC,
            do_not_specialize_zero_one=True,
        )
        if isinstance(new, sympy.Symbol):
            env.constrain_symbol_range(
                new, compiler_min=lo, compiler_max=int_oo if hi is None else hi
            )
        mapping[s] = new
        new_hints[s] = hint

    def conv(v: Any) -> Any:
        if not isinstance(v, torch.SymInt):
            return v
        expr = v.node.expr.xreplace(mapping)
        if not expr.free_symbols:
            return int(expr)
        hint = int(v.node.expr.xreplace({s: sympy.Integer(h) for s, h in new_hints.items()}))
        return env.create_symintnode(expr, hint=hint)

    if symbols_out is not None:
        symbols_out.update(mapping)
    out: list[Any] = []
    for v in examples:
        if isinstance(v, torch.SymInt):
            out.append(conv(v))
        elif isinstance(v, (torch.SymFloat, torch.SymBool)):
            if is_symbolic(v):
                raise ValueError(f"cannot re-create a symbolic {type(v).__name__} input ({v})")
            out.append(concrete_value(v, 0))
        elif isinstance(v, torch.Tensor):
            if v.layout != torch.strided:
                raise ValueError(f"fresh_args supports strided tensors only, got {v.layout}")
            shape = [conv(d) for d in v.shape]
            stride = [conv(d) for d in v.stride()]
            offset = conv(v.storage_offset())
            with fake_mode:
                t = torch.empty_strided(shape, stride, dtype=v.dtype, device=v.device)
                if not (isinstance(offset, int) and offset == 0):
                    t = torch.empty(
                        offset + t.untyped_storage().nbytes() // t.element_size(),
                        dtype=v.dtype,
                        device=v.device,
                    ).as_strided(shape, stride, offset)
            if v.requires_grad:
                t = t.detach().requires_grad_(True)
            out.append(t)
        else:
            out.append(v)
    return out
