"""Helpers shared by the split / piecewise / backend tests (not collected: no ``test_`` prefix)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

ATTENTION = "fxcodegen_toy::attention"


@dataclass
class Captured:
    """Graphs Dynamo handed to a recording backend, and the real arguments of each call."""

    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    calls: list[tuple[int, tuple[Any, ...]]] = field(default_factory=list)


def capture(fn: Callable[..., Any], *inputs: Any, dynamic: bool = True) -> Captured:
    """Run ``torch.compile(fn, dynamic=dynamic)`` on each input tuple with a backend that
    records the graphs and the real arguments they were called with."""
    torch._dynamo.reset()
    cap = Captured()

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        index = len(cap.graphs)
        cap.graphs.append(gm)

        def run(*args: Any) -> Any:
            cap.calls.append((index, args))
            return gm(*args)

        return run

    compiled = torch.compile(fn, backend=record, dynamic=dynamic)
    for args in inputs:
        compiled(*args)
    return cap


def symbolic_env(hint: int = 5) -> tuple[ShapeEnv, FakeTensorMode, torch.SymInt]:
    """A ShapeEnv, a FakeTensorMode on it and one backed dynamic SymInt ``s``."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    sym = env.create_symbol(hint, ConstantSource("s_test"), dynamic_dim=DimDynamic.DYNAMIC)
    return env, mode, env.create_symintnode(sym, hint=hint)


def graph_with_examples(
    examples: list[Any], *, meta_key: str = "example_value"
) -> torch.fx.GraphModule:
    """A GraphModule whose placeholders carry ``examples`` and which returns them."""
    g = torch.fx.Graph()
    nodes = []
    for i, ex in enumerate(examples):
        n = g.placeholder(f"arg{i}")
        n.meta[meta_key] = ex
        nodes.append(n)
    g.output(tuple(nodes))
    return torch.fx.GraphModule(torch.nn.Module(), g)
