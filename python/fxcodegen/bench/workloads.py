"""Deterministic benchmark graphs, parameterised by size.

Three shapes (issue 3):

- :func:`stitch`: a stitching graph of L layers, each a ``call_module`` on an opaque child with
  positional args (the previous value, the input, a symbolic size) and kwargs (a float and a list
  holding the size), followed by a ``getitem``.
- :func:`inline`: a stitching graph whose single child is a plain ``GraphModule`` of N aten ops;
  a quarter are ``_to_copy`` with ``dtype=`` and a freshly built ``device=`` (pool pressure), the
  rest binary ops.
- :func:`model`: Dynamo's graph of :func:`fxcodegen.toy.make_decoder` split at its attention op.

Large graphs are built node by node without tracing, and without ``GraphModule.recompile`` (which
runs torch.fx's own codegen: 30 µs/node). Pass ``recompile=True`` for graphs that must run
through torch (small sizes only).
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.node import Node

__all__ = [
    "SHAPES",
    "Piece",
    "Workload",
    "build",
    "count_nodes",
    "inline",
    "model",
    "stitch",
    "trivial_piece",
]

aten = torch.ops.aten


@dataclass
class Workload:
    """A graph to generate code for, and inputs to run it on."""

    shape: str
    gm: fx.GraphModule
    num_nodes: int
    """Nodes of the stitching graph plus those of every inlined (GraphModule) child."""
    args: tuple[Any, ...] = ()
    """Inputs on which ``gm`` runs (meaningful for small sizes)."""
    meta: dict[str, Any] = field(default_factory=dict)


class Piece(torch.nn.Module):
    """Stand-in for a compiled piece: opaque to codegen (not a GraphModule), returns a 1-tuple."""

    def forward(self, prev: Any, x: Any, s: int, *, scale: float, sizes: list[int]) -> tuple:
        if sizes[0] != s:
            raise ValueError(f"sizes {sizes} do not start with {s}")
        return (prev * scale + x,)


def trivial_piece(prev: Any, x: Any, s: int, *, scale: float, sizes: list[int]) -> tuple:
    """The cheapest opaque child with :class:`Piece`'s signature (for runtime comparisons)."""
    return (prev,)


@contextmanager
def _no_gc() -> Iterator[None]:
    # Building a million nodes with the cyclic GC on spends most of the time in gen-2 scans.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Builder:
    """Appends nodes to a graph: ``Graph.create_node`` without its per-node pytree scan."""

    def __init__(self) -> None:
        self.graph = fx.Graph()
        g = self.graph
        self._fast = all(
            hasattr(g, a)
            for a in ("_graph_namespace", "_insert", "_find_nodes_lookup_table", "_len")
        )

    def node(
        self,
        op: str,
        target: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        g = self.graph
        if not self._fast:  # pragma: no cover - other torch versions
            return g.create_node(op, target, args, kwargs, name)
        ns = g._graph_namespace
        name = ns.create_name(name if name is not None else g._target_to_str(target), None)
        n = Node(g, name, op, target, args, kwargs or {})
        ns.associate_name_with_obj(name, n)
        g._insert(n)
        g._find_nodes_lookup_table.insert(n)
        g._len += 1
        return n


def _module(
    graph: fx.Graph, children: dict[str, torch.nn.Module], recompile: bool
) -> fx.GraphModule:
    stub = fx.Graph()
    stub.output(None)
    gm = fx.GraphModule(torch.nn.Module(), stub)
    gm._modules.update(children)
    gm._graph = graph
    graph.owning_module = gm
    if recompile:
        gm.recompile()
    return gm


def count_nodes(gm: fx.GraphModule) -> int:
    """Nodes of ``gm``'s graph plus, recursively, those of its inlined GraphModule children."""
    total = 0
    seen: set[str] = set()
    for node in gm.graph.nodes:
        total += 1
        if node.op == "call_module" and node.target not in seen:
            seen.add(node.target)
            child = gm.get_submodule(node.target)
            if isinstance(child, fx.GraphModule):
                total += count_nodes(child)
    return total


def stitch(
    num_nodes: int,
    *,
    shared_child: bool = True,
    recompile: bool = False,
    child: torch.nn.Module | None = None,
) -> Workload:
    """A stitching graph of about ``num_nodes`` nodes (2 per layer, plus 3).

    Every layer calls its own target ``submod_{i}``; with ``shared_child`` all targets name one
    :class:`Piece` object (distinct modules cost ~1 kB each, too much at a million nodes).
    """
    layers = max(1, (num_nodes - 3) // 2)
    b = _Builder()
    node = b.node
    with _no_gc():
        x = node("placeholder", "x", name="x")
        s = node("placeholder", "s0", name="s0")
        prev = x
        for i in range(layers):
            out = node(
                "call_module",
                f"submod_{i}",
                (prev, x, s),
                {"scale": 0.5, "sizes": [s, 16]},
                name=f"submod_{i}",
            )
            prev = node("call_function", operator.getitem, (out, 0), name=f"getitem_{i}")
        node("output", "output", (prev,))
        one = child if child is not None else Piece()
        if shared_child:
            children = {f"submod_{i}": one for i in range(layers)}
        else:
            children = {f"submod_{i}": Piece() for i in range(layers)}
        gm = _module(b.graph, children, recompile)
    args = (torch.linspace(-1.0, 1.0, 8).reshape(2, 4), 4)
    return Workload("stitch", gm, layers * 2 + 3, args, {"layers": layers})


_BINARY: list[Callable[..., Any]] = [aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor]


def inline(num_nodes: int, *, recompile: bool = False) -> Workload:
    """A stitching graph around one plain GraphModule child of about ``num_nodes`` aten ops.

    Op ``i`` is ``_to_copy(prev, dtype=float32, device=<a new torch.device>)`` when ``i % 4 == 0``;
    otherwise ``add(prev, x)``, ``mul(prev, 0.5)`` or ``sub(prev, x)`` (values stay bounded).
    """
    n_ops = max(1, num_nodes - 6)
    b = _Builder()
    node = b.node
    with _no_gc():
        x = node("placeholder", "x", name="x")
        prev = x
        for i in range(n_ops):
            k = i % 4
            if k == 0:
                kwargs = {"dtype": torch.float32, "device": torch.device("cpu")}
                prev = node("call_function", aten._to_copy.default, (prev,), kwargs, f"to_{i}")
            elif k == 2:
                prev = node("call_function", aten.mul.Tensor, (prev, 0.5), name=f"mul_{i}")
            else:
                prev = node("call_function", _BINARY[k - 1], (prev, x), name=f"op_{i}")
        node("output", "output", ((prev,),))
        child = _module(b.graph, {}, recompile)

        outer = _Builder()
        ox = outer.node("placeholder", "x", name="x")
        out = outer.node("call_module", "submod_0", (ox,), name="submod_0")
        item = outer.node("call_function", operator.getitem, (out, 0), name="getitem")
        outer.node("output", "output", (item,))
        gm = _module(outer.graph, {"submod_0": child}, recompile)
    args = (torch.linspace(-1.0, 1.0, 8).reshape(2, 4),)
    return Workload("inline", gm, n_ops + 2 + 4, args, {"ops": n_ops})


def model_available() -> bool:
    """Whether :func:`model` can run (its toy decoder and splitter exist)."""
    try:
        from fxcodegen.split import split_graph  # noqa: F401
        from fxcodegen.toy import make_decoder  # noqa: F401
    except ImportError:
        return False
    return True


def model(
    num_layers: int = 32, *, hidden: int = 64, heads: int = 4, num_tokens: int = 8
) -> Workload:
    """Dynamo's graph of a generated decoder, split at its attention custom op.

    The graph comes from ``torch.compile(..., dynamic=True)`` with a capturing backend, so it
    carries the symbolic token count and the lifted parameters as placeholders.
    """
    from fxcodegen.split import split_graph
    from fxcodegen.toy import make_decoder

    torch.manual_seed(0)
    decoder = make_decoder(num_layers=num_layers, hidden=hidden, heads=heads, seed=0)
    captured: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(decoder, backend=capture, dynamic=True, fullgraph=True)
    x = torch.randn(num_tokens, hidden)
    with torch.no_grad():
        expected = compiled(x)
    torch._dynamo.reset()
    if len(captured) != 1:
        raise RuntimeError(f"expected one Dynamo graph, got {len(captured)}")
    gm, example = captured[0]
    split_gm, items = split_graph(gm, ["fxcodegen_toy::attention"])
    args = tuple(example)
    return Workload(
        "model",
        split_gm,
        count_nodes(split_gm),
        args,
        {
            "layers": num_layers,
            "pieces": len(items),
            "dynamo_nodes": len(gm.graph.nodes),
            "expected": expected,
        },
    )


SHAPES: dict[str, Callable[[int], Workload]] = {"stitch": stitch, "inline": inline}
"""Size-parameterised shapes (``model`` is parameterised by layers instead)."""


def build(shape: str, size: int) -> Workload:
    """The workload of ``shape`` (a key of :data:`SHAPES`, or ``"model"``) at ``size`` (nodes;
    layers for ``model``)."""
    if shape == "model":
        return model(size)
    return SHAPES[shape](size)
