"""The training run behind the release build's profile-guided optimisation (``make pgo``).

``make pgo`` builds the extension instrumented, runs this script against it, and merges what it
counted into ``benches/pgo/fxcodegen.profdata``, which ``make install`` builds with. The graphs
here are generated from a seed and differ on purpose from the benchmark's workloads (other ops,
argument kinds and sizes, several children, nested inlining, ``get_attr``, errors), so the
profile describes fxcodegen's code paths rather than the graphs the benchmark times.

Run it only through ``make pgo``: it refuses to run against an extension that is not the
instrumented one (the profile would silently miss).
"""

from __future__ import annotations

import operator
import os
import random
import sys
import time
from typing import Any

import fxcodegen
import torch
import torch.fx as fx
from fxcodegen import CodegenError, _core
from fxcodegen.bench.workloads import _Builder, _module, _no_gc, model, model_available
from fxcodegen.compat import vllm

aten = torch.ops.aten

# Constants an argument may hold: literals, pooled objects, containers.
_CONSTS: list[Any] = [
    None,
    True,
    False,
    0,
    7,
    -3,
    2**40,
    2**70,
    0.25,
    1e-3,
    float("inf"),
    "text",
    "it's\n",
    b"raw",
    torch.float16,
    torch.int64,
    torch.device("cpu"),
    torch.device("cuda", 1),
    torch.contiguous_format,
    (1, 2),
    [3, (4, None)],
    {"k": 1.5, "j": [2]},
]
_KEYS = ["alpha", "dim", "out_dtype", "layout", "eps", "tag", "keepdim", "sizes"]


class Opaque(torch.nn.Module):
    """A child codegen treats as opaque (not a GraphModule)."""

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return (args[0], args[0])


def _value(rng: random.Random, values: list[Any]) -> Any:
    if rng.random() < 0.5:
        return rng.choice(values)
    c = rng.choice(_CONSTS)
    if rng.random() < 0.15:
        return [rng.choice(values), c]
    return c


def opaque_root(rng: random.Random, num_nodes: int) -> fx.GraphModule:
    """A stitching root of opaque children with varied arguments, getitems and small ops."""
    b = _Builder()
    node = b.node
    with _no_gc():
        inputs = [node("placeholder", f"in_{k}", name=f"in_{k}") for k in range(rng.randint(1, 4))]
        prev = inputs[0]
        one = Opaque()
        children: dict[str, torch.nn.Module] = {}
        i = 0
        while b.graph._len < num_nodes - 2:
            values = [prev, *inputs]
            args = (prev, *(_value(rng, values) for _ in range(rng.randint(0, 3))))
            kwargs = {k: _value(rng, values) for k in rng.sample(_KEYS, rng.randint(0, 3))}
            target = f"piece_{i}"
            children[target] = one
            out = node("call_module", target, args, kwargs, name=target)
            r = rng.random()
            if r < 0.7:
                prev = node("call_function", operator.getitem, (out, rng.randrange(2)))
            elif r < 0.8:
                prev = node("call_function", operator.add, (out, rng.choice(inputs)))
            elif r < 0.9:
                prev = node("call_method", "size", (out,), {"dim": 0})
            else:
                prev = out
            i += 1
        node("output", "output", ((prev, inputs[-1]),))
        return _module(b.graph, children, False)


def _with_inputs() -> tuple[_Builder, fx.Node, fx.Node]:
    """A graph builder with the placeholders ``x`` (a tensor) and ``s`` (a size) added."""
    b = _Builder()
    return b, b.node("placeholder", "x", name="x"), b.node("placeholder", "s", name="s")


def _ops_child(rng: random.Random, num_nodes: int, depth: int) -> fx.GraphModule:
    """A plain GraphModule of aten ops, some calling a nested plain child."""
    children: dict[str, torch.nn.Module] = {}
    with _no_gc():
        b, x, s = _with_inputs()
        node = b.node
        w = node("get_attr", "w")
        prev = x
        kept = [x, w]
        while b.graph._len < num_nodes - 1:
            r = rng.random()
            if r < 0.2:
                kw = {"dtype": rng.choice([torch.float16, torch.float32])}
                if rng.random() < 0.5:
                    kw["device"] = torch.device("cpu")
                prev = node("call_function", aten._to_copy.default, (prev,), kw)
            elif r < 0.4:
                prev = node("call_function", aten.add.Tensor, (prev, rng.choice(kept)), {})
            elif r < 0.5:
                prev = node("call_function", aten.relu.default, (prev,))
            elif r < 0.6:
                prev = node("call_function", aten.view.default, (prev, [s, -1]))
            elif r < 0.7:
                prev = node("call_function", aten.sum.dim_IntList, (prev, [0], True))
            elif r < 0.8:
                parts = node("call_function", aten.split.Tensor, (prev, 2))
                prev = node("call_function", operator.getitem, (parts, rng.randrange(2)))
            elif r < 0.9:
                prev = node("call_function", aten.cat.default, ([prev, rng.choice(kept)], 1))
            elif r < 0.93 and depth > 0:
                target = f"inner_{len(children)}"
                children[target] = _ops_child(rng, rng.randint(5, 40), depth - 1)
                out = node("call_module", target, (prev, s))
                prev = node("call_function", operator.getitem, (out, 0))
            else:
                prev = node("call_function", aten.mul.Tensor, (prev, _value(rng, kept)))
            if rng.random() < 0.05:
                kept.append(prev)
        node("output", "output", ((prev,),))
        gm = _module(b.graph, children, False)
    gm.register_buffer("w", torch.ones(1))
    return gm


def inline_root(rng: random.Random, num_nodes: int) -> fx.GraphModule:
    """A root calling one to three plain GraphModule children between opaque ones."""
    n_children = rng.randint(1, 3)
    children: dict[str, torch.nn.Module] = {}
    with _no_gc():
        b, x, s = _with_inputs()
        node = b.node
        prev = x
        for k in range(n_children):
            children[f"graph_{k}"] = _ops_child(rng, num_nodes // n_children, depth=2)
            out = node("call_module", f"graph_{k}", (prev, s), name=f"graph_{k}")
            prev = node("call_function", operator.getitem, (out, 0))
            children[f"opaque_{k}"] = Opaque()
            out = node("call_module", f"opaque_{k}", (prev,), {"scale": 2.0})
            prev = node("call_function", operator.getitem, (out, 1))
        node("output", "output", (prev,))
        return _module(b.graph, children, False)


def broken(rng: random.Random) -> fx.GraphModule:
    """A graph codegen refuses (a call_module whose child does not exist)."""
    gm = opaque_root(rng, 20)
    g = gm.graph
    last = next(n for n in g.nodes if n.op == "call_module")
    with g.inserting_after(last):
        g.create_node("call_module", "missing_child", (last,))
    return gm


SIZES = (30, 700, 6_000, 60_000, 200_000)
"""Graph sizes in nodes: both sides of the helper's 4,096-node threshold and of the emitter's
16,384-node threshold for two threads."""


def train(sizes: tuple[int, ...] = SIZES, nodes_per_size: int = 1_200_000) -> None:
    """Generates code for every kind of graph above, about ``nodes_per_size`` nodes of each
    size in all (at most 300 calls per graph); also the serialized path, vLLM's layout and
    errors."""
    rng = random.Random(20261201)
    t0 = time.perf_counter()
    for size in sizes:
        reps = max(1, min(300, nodes_per_size // size))
        for make in (opaque_root, inline_root):
            gm = make(rng, size)
            for _ in range(reps):
                fxcodegen.generate(gm)
            if size <= 60_000:
                fxcodegen.emit(fxcodegen.serialize(gm))
                vllm.generate_execution_code(gm)
        print(f"pgo/train.py: {size} nodes done at {time.perf_counter() - t0:.1f}s", flush=True)
    for _ in range(20):
        try:
            fxcodegen.generate(broken(rng))
        except CodegenError:
            pass
        try:
            fxcodegen.emit(b"\x00" + rng.randbytes(rng.randint(0, 200)))
        except CodegenError:
            pass


def main() -> None:
    core = os.path.realpath(_core.__file__)
    want = os.environ.get("FXCODEGEN_PGO_EXT")
    if not want or not core.startswith(os.path.realpath(want)):
        sys.exit(f"pgo/train.py: not the instrumented extension ({core}); run `make pgo`")
    t0 = time.perf_counter()
    train()
    if model_available():
        gm = model(6).gm
        for _ in range(200):
            fxcodegen.generate(gm)
    print(f"pgo/train.py: done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
