"""Split a graph into pieces at "splitting ops" (e.g. attention).

The pieces between splitting ops are what gets compiled; the splitting pieces stay plain
GraphModules (fxcodegen inlines them into the stitching function).
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch.fx.passes.split_module import split_module

__all__ = ["SplitItem", "resolve_splitting_ops", "split_graph"]


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


OpSpec = str | torch._ops.OpOverload | torch._ops.OpOverloadPacket


def _resolve_one(spec: OpSpec) -> torch._ops.OpOverload | torch._ops.OpOverloadPacket:
    if isinstance(spec, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"splitting op must be a name like 'ns::op' or 'ns::op.overload', or an op, "
            f"got {type(spec).__name__} {spec!r}"
        )
    ns, sep, rest = spec.partition("::")
    op_name, dot, overload = rest.partition(".")
    if not sep or not ns or not op_name or (dot and not overload) or "." in overload:
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
        return packet
    if overload not in packet.overloads():
        raise ValueError(
            f"unknown splitting op {spec!r}: {ns}::{op_name} has no overload {overload!r} "
            f"(overloads: {', '.join(packet.overloads())})"
        )
    return getattr(packet, overload)


def resolve_splitting_ops(
    splitting_ops: Iterable[OpSpec],
) -> tuple[frozenset[torch._ops.OpOverloadPacket], frozenset[torch._ops.OpOverload]]:
    """The packets (``"ns::op"``) and overloads (``"ns::op.overload"``) named by ``splitting_ops``.

    Raises ``ValueError`` for a malformed or unknown name.
    """
    if isinstance(splitting_ops, (str, bytes)):
        raise TypeError(
            f"splitting_ops must be a list of op names, not a single string ({splitting_ops!r}); "
            f"write [{splitting_ops!r}]"
        )
    packets: set[torch._ops.OpOverloadPacket] = set()
    overloads: set[torch._ops.OpOverload] = set()
    for spec in splitting_ops:
        op = _resolve_one(spec)
        if isinstance(op, torch._ops.OpOverloadPacket):
            packets.add(op)
        else:
            overloads.add(op)
    return frozenset(packets), frozenset(overloads)


def _matcher(
    packets: frozenset[torch._ops.OpOverloadPacket], overloads: frozenset[torch._ops.OpOverload]
) -> Any:
    def is_splitting(node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            return target in overloads or target.overloadpacket in packets
        if isinstance(target, torch._ops.OpOverloadPacket):
            if target in packets:
                return True
            # A packet call (Dynamo records custom ops this way) resolves to an overload at
            # run time; it matches an overload spec only when that is its sole overload.
            names = target.overloads()
            return len(names) == 1 and getattr(target, names[0]) in overloads
        return False

    return is_splitting


_HAS_TUPLE_RETURN = "tuple_return" in inspect.signature(split_module).parameters


def split_graph(
    gm: torch.fx.GraphModule, splitting_ops: Iterable[OpSpec]
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Split ``gm`` at the ops named in ``splitting_ops``.

    ``splitting_ops`` holds names ``"ns::op"`` (any overload) or ``"ns::op.overload"``;
    nodes whose target is an OpOverload or OpOverloadPacket of a named op become splitting
    pieces. Consecutive splitting ops share one piece; an ``operator.getitem`` on a node stays
    in its producer's piece; pieces keep the original node order and return tuples (even for a
    single output). Returns the split graph and its pieces in call order.
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"split_graph expects a torch.fx.GraphModule, got {type(gm).__name__}")
    is_splitting = _matcher(*resolve_splitting_ops(splitting_ops))

    piece_of: dict[torch.fx.Node, int] = {}
    splitting_ids: set[int] = set()
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
        splitting = is_splitting(node)
        if piece_used and splitting != in_splitting:
            piece += 1
        piece_of[node] = piece
        piece_used = True
        in_splitting = splitting
        if splitting:
            splitting_ids.add(piece)

    kwargs: dict[str, Any] = {"keep_original_order": True}
    if _HAS_TUPLE_RETURN:
        kwargs["tuple_return"] = True
    split_gm = split_module(gm, gm, piece_of.__getitem__, **kwargs)

    items = []
    for node in split_gm.graph.nodes:
        if node.op != "call_module":
            continue
        name = str(node.target)
        graph_id = int(name.rsplit("_", 1)[1])
        child = split_gm.get_submodule(name)
        items.append(SplitItem(name, graph_id, graph_id in splitting_ids, child))
    return split_gm, items
