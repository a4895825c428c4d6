"""Split a graph into pieces at "splitting ops" (e.g. attention).

The pieces between splitting ops are what gets compiled; the splitting pieces stay plain
GraphModules (fxcodegen inlines them into the stitching function).

What a splitting op may be (resolved once, by :func:`resolve_splitting_ops`):

- a ``torch.ops`` operator: a name ``"ns::op"`` / ``"ns::op.overload"`` or the object;
- a torch function: the object (``torch.nn.functional.scaled_dot_product_attention``) or its
  dotted name (``"torch.nn.functional.scaled_dot_product_attention"``);
- an ``aten`` operator also matches the function and method forms Dynamo records for it:
  ``aten::NAME`` matches ``call_function`` nodes on ``torch.NAME``,
  ``torch.nn.functional.NAME``, ``torch._C._nn.NAME``, ``torch._C._special.NAME`` or
  ``torch._C._linalg.NAME`` (any that exist) and ``call_method`` nodes ``tensor.NAME(...)``.

Non-tensor values (Python scalars and SymInt/SymFloat/SymBool) that one piece computes and
another consumes are recomputed in the consuming piece (:func:`split_graph`), so no piece
hands a Python scalar to the next: a compiled piece cannot return one.
"""

from __future__ import annotations

import importlib
import logging
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.fx.passes.split_module import split_module

__all__ = ["SplitItem", "SplittingOps", "dense_in_order", "resolve_splitting_ops", "split_graph"]

log = logging.getLogger("fxcodegen")


class SplitItem(NamedTuple):
    """One piece of a split graph, in call order."""

    submod_name: str
    """The attribute name of the piece in the split graph (``submod_<graph_id>``)."""
    graph_id: int
    """The partition number."""
    is_splitting_graph: bool
    """True for a piece made of splitting ops (and getitems on their results)."""
    graph: torch.fx.GraphModule
    """The piece itself."""


OpSpec = str | torch._ops.OpOverload | torch._ops.OpOverloadPacket | Callable[..., Any]

_OPS = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)

# Where Dynamo finds the function form of an aten operator.
_FUNCTION_HOMES = (
    torch,
    torch.nn.functional,
    torch._C._nn,
    torch._C._special,
    torch._C._linalg,
)


@dataclass(frozen=True)
class _Spec:
    """One resolved splitting op: its canonical name and what it matches."""

    name: str
    packets: frozenset[torch._ops.OpOverloadPacket] = frozenset()
    overloads: frozenset[torch._ops.OpOverload] = frozenset()
    functions: tuple[Any, ...] = ()
    methods: frozenset[str] = frozenset()

    def matches(self, node: torch.fx.Node) -> bool:
        target = node.target
        if node.op == "call_method":
            return target in self.methods
        if node.op != "call_function":
            return False
        if isinstance(target, torch._ops.OpOverload):
            return target in self.overloads or target.overloadpacket in self.packets
        if isinstance(target, torch._ops.OpOverloadPacket):
            if target in self.packets:
                return True
            # A packet call (Dynamo records custom ops this way) resolves to an overload at
            # run time; it matches an overload spec only when that is its sole overload.
            names = target.overloads()
            return len(names) == 1 and getattr(target, names[0]) in self.overloads
        return any(target is f for f in self.functions)


def _function_forms(op: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> dict[str, Any]:
    """The torch functions and tensor method name Dynamo records for an aten operator."""
    packet = op.overloadpacket if isinstance(op, torch._ops.OpOverload) else op
    ns, _, name = packet._qualified_op_name.partition("::")
    if ns != "aten":
        return {"functions": (), "methods": frozenset()}
    functions = []
    for home in _FUNCTION_HOMES:
        fn = getattr(home, name, None)
        if callable(fn) and not any(fn is f for f in functions):
            functions.append(fn)
    methods = frozenset([name]) if callable(getattr(torch.Tensor, name, None)) else frozenset()
    return {"functions": tuple(functions), "methods": methods}


def _op_spec(op: torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> _Spec:
    if isinstance(op, torch._ops.OpOverload):
        return _Spec(op.name(), overloads=frozenset([op]), **_function_forms(op))
    return _Spec(op._qualified_op_name, packets=frozenset([op]), **_function_forms(op))


def _resolve_op_name(spec: str) -> _Spec:
    ns, _, rest = spec.partition("::")
    op_name, dot, overload = rest.partition(".")
    if not ns or not op_name or (dot and not overload) or "." in overload:
        raise ValueError(f"splitting op {spec!r} is not of the form 'ns::op' or 'ns::op.overload'")
    try:
        packet = getattr(getattr(torch.ops, ns), op_name)
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise ValueError(
            f"unknown splitting op {spec!r}: no operator {ns}::{op_name} is registered "
            f"(torch.ops.{ns}.{op_name} does not exist; is the library that defines it imported?)"
        )
    if not dot:
        return _op_spec(packet)
    if overload not in packet.overloads():
        raise ValueError(
            f"unknown splitting op {spec!r}: {ns}::{op_name} has no overload {overload!r} "
            f"(overloads: {', '.join(packet.overloads())})"
        )
    return _op_spec(getattr(packet, overload))


def _resolve_dotted(spec: str) -> _Spec:
    parts = spec.split(".")
    if not all(p.isidentifier() for p in parts) or len(parts) < 2:
        raise ValueError(
            f"splitting op {spec!r} is neither 'ns::op[.overload]' nor a dotted name such as "
            "'torch.nn.functional.scaled_dot_product_attention'"
        )
    obj: Any = None
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            obj = None
        break
    if obj is None:
        raise ValueError(f"unknown splitting op {spec!r}: no such module attribute")
    return _resolve_object(obj, spec)


def _resolve_object(obj: Any, name: str | None = None) -> _Spec:
    if isinstance(obj, _OPS):
        return _op_spec(obj)
    if not callable(obj) or isinstance(obj, type):
        raise TypeError(
            f"splitting op must be an op name ('ns::op[.overload]'), a torch.ops operator, or "
            f"a torch function (object or dotted name), got {type(obj).__name__} {obj!r}"
        )
    module = getattr(obj, "__module__", None) or "torch"
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return _Spec(name or f"{module}.{qual}", functions=(obj,))


def _resolve_one(spec: OpSpec) -> _Spec:
    if isinstance(spec, str):
        return _resolve_op_name(spec) if "::" in spec else _resolve_dotted(spec)
    return _resolve_object(spec)


class SplittingOps:
    """Resolved splitting ops: ``names`` (canonical, for keys and logs) and a node matcher."""

    def __init__(self, specs: tuple[_Spec, ...]) -> None:
        self.specs = specs
        self.names = tuple(s.name for s in specs)

    def matching(self, node: torch.fx.Node) -> list[str]:
        """The names of the specs ``node`` matches."""
        return [s.name for s in self.specs if s.matches(node)]

    def __repr__(self) -> str:
        return f"SplittingOps({list(self.names)!r})"


def resolve_splitting_ops(splitting_ops: Iterable[OpSpec] | SplittingOps) -> SplittingOps:
    """Resolve ``splitting_ops`` (see the module docstring).

    Raises ``TypeError`` for something that is not a list of ops, and ``ValueError`` for a
    malformed or unknown name.
    """
    if isinstance(splitting_ops, SplittingOps):
        return splitting_ops
    if isinstance(splitting_ops, (str, bytes)):
        raise TypeError(
            f"splitting_ops must be a list of op names, not a single string ({splitting_ops!r}); "
            f"write [{splitting_ops!r}]"
        )
    if splitting_ops is None or isinstance(splitting_ops, _OPS) or callable(splitting_ops):
        raise TypeError(
            f"splitting_ops must be a list of ops (e.g. "
            f"['torch.nn.functional.scaled_dot_product_attention']), got {splitting_ops!r}"
        )
    try:
        specs = list(splitting_ops)
    except TypeError:
        raise TypeError(
            f"splitting_ops must be a list of ops, got {type(splitting_ops).__name__}"
        ) from None
    out: dict[str, _Spec] = {}
    for spec in specs:
        resolved = _resolve_one(spec)
        out.setdefault(resolved.name, resolved)
    return SplittingOps(tuple(out.values()))


def _is_scalar_node(node: torch.fx.Node) -> bool:
    """A computed value that is a Python or symbolic scalar, not a tensor."""
    if node.op not in ("call_function", "call_method"):
        return False
    value = node.meta.get("example_value", node.meta.get("val"))
    return isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _recompute_scalars(
    gm: torch.fx.GraphModule, piece_of: dict[torch.fx.Node, int], keep: set[torch.fx.Node]
) -> None:
    """Give each piece that consumes a scalar computed in another piece its own copy of that
    computation (and of the scalars it is computed from), placed right before its first use,
    so that no piece returns a scalar. A scalar no longer used where it was computed goes.
    Splitting ops (``keep``) stay where they are."""
    graph = gm.graph
    for node in reversed(list(graph.nodes)):
        if node not in piece_of or node in keep or not _is_scalar_node(node):
            continue
        home = piece_of[node]
        by_piece: dict[int, list[torch.fx.Node]] = {}
        for user in node.users:
            p = piece_of.get(user)
            if p is not None and p != home:
                by_piece.setdefault(p, []).append(user)
        for p, users in by_piece.items():
            first = min(users, key=_position(graph))
            with graph.inserting_before(first):
                copy = graph.node_copy(node)
            copy.meta = dict(node.meta)
            piece_of[copy] = p
            for user in users:
                user.replace_input_with(node, copy)
        if not node.users:
            graph.erase_node(node)
            del piece_of[node]


def _position(graph: torch.fx.Graph) -> Callable[[torch.fx.Node], int]:
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


def dense_in_order(t: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """``t`` when its strides are those of a dense tensor whose dimensions are laid out in
    ``order`` (innermost first), else a copy laid out so."""
    stride = [0] * t.dim()
    step = 1
    for d in order:
        stride[d] = step
        step *= t.shape[d]
    if list(t.stride()) == stride:
        return t
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _hint(d: Any) -> int | None:
    if isinstance(d, torch.SymInt):
        hint = d.node.hint
        return hint if isinstance(hint, int) else None
    return int(d)


def _dense_order(value: Any) -> tuple[int, ...] | None:
    """The dimension order (innermost first) of a dense strided example tensor, else None."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.dim() == 0:
        return None
    # Hints, read without guarding: int() of a SymInt would specialise the graph on it.
    shape = [_hint(d) for d in value.shape]
    strides = [_hint(d) for d in value.stride()]
    if None in shape or None in strides:
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: (strides[d], -d)))  # type: ignore[index]
    step = 1
    for d in order:
        if strides[d] != step and shape[d] != 1:
            return None
        step *= shape[d]
    return order


def _fix_layouts(
    gm: torch.fx.GraphModule, piece_of: dict[torch.fx.Node, int], splitting_ids: set[int]
) -> None:
    """A compiled piece checks that each input tensor has the strides of its example value.
    An op run eagerly in a splitting piece may return other strides than its meta kernel
    says (CPU attention returns ``(batch, tokens, heads, dim)`` memory seen as ``(batch,
    heads, tokens, dim)``), so every tensor a splitting piece hands to another piece goes
    through :func:`dense_in_order`, which copies only when the layouts differ."""
    graph = gm.graph
    for node in list(graph.nodes):
        piece = piece_of.get(node)
        if piece not in splitting_ids:
            continue
        outside = [u for u in node.users if piece_of.get(u, -1) != piece]
        value = node.meta.get("example_value", node.meta.get("val"))
        order = _dense_order(value)
        if not outside or order is None:
            continue
        with graph.inserting_after(node):
            fixed = graph.call_function(dense_in_order, (node, order))
        fixed.meta = dict(node.meta)
        piece_of[fixed] = piece
        for user in outside:
            user.replace_input_with(node, fixed)


def split_graph(
    gm: torch.fx.GraphModule,
    splitting_ops: Iterable[OpSpec] | SplittingOps,
    *,
    graph_name: str = "graph",
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Split ``gm`` at the ops named in ``splitting_ops`` (see the module docstring).

    Nodes matching a splitting op become splitting pieces. Consecutive splitting ops share
    one piece; an ``operator.getitem`` on a node stays in its producer's piece; a scalar that
    one piece computes and another uses is recomputed in the user's piece (``gm`` is changed
    in place for that); pieces keep the original node order and return tuples (even for a
    single output). A splitting op that matches no node of ``gm`` is logged as a WARNING
    naming it and ``graph_name``. Returns the split graph and its pieces in call order.
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"split_graph expects a torch.fx.GraphModule, got {type(gm).__name__}")
    ops = resolve_splitting_ops(splitting_ops)

    piece_of: dict[torch.fx.Node, int] = {}
    splitting_ids: set[int] = set()
    matched: set[str] = set()
    splitting_nodes: set[torch.fx.Node] = set()
    piece = 0
    piece_used = False
    in_splitting = False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue  # split_module places these itself
        producer = node.args[0] if node.args else None
        if (
            node.op == "call_function"
            and node.target is operator.getitem
            and isinstance(producer, torch.fx.Node)
            and producer in piece_of
        ):
            piece_of[node] = piece_of[producer]
            continue
        names = ops.matching(node)
        matched.update(names)
        splitting = bool(names)
        if piece_used and splitting != in_splitting:
            piece += 1
        piece_of[node] = piece
        piece_used = True
        in_splitting = splitting
        if splitting:
            splitting_ids.add(piece)
            splitting_nodes.add(node)
    for name in ops.names:
        if name not in matched:
            log.warning("fxcodegen: splitting op %s matches no node of %s", name, graph_name)

    _recompute_scalars(gm, piece_of, splitting_nodes)
    _fix_layouts(gm, piece_of, splitting_ids)
    gm.recompile()

    split_gm = split_module(
        gm, gm, piece_of.__getitem__, keep_original_order=True, tuple_return=True
    )

    items = []
    for node in split_gm.graph.nodes:
        if node.op != "call_module":
            continue
        name = str(node.target)
        graph_id = int(name.rsplit("_", 1)[1])
        child = split_gm.get_submodule(name)
        items.append(SplitItem(name, graph_id, graph_id in splitting_ids, child))
    return split_gm, items
