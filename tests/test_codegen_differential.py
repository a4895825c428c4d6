"""Differential test: randomized split graphs, the compiled function against torch.fx.

Each seed builds a split graph with several plain-GraphModule children (inlined, some nesting
another inlined child or calling an opaque one), opaque children (nn.Modules, or bare Python
callables bound through ``compile_execution_fn``), random wiring, random literal and pooled
kwargs, getitem on tuple outputs (used or not) and a nested output; the result of the generated
function must equal ``torch.fx.Interpreter`` and the GraphModule itself, bit for bit.
"""

from __future__ import annotations

import hashlib
import operator
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fxcodegen
import pytest
import torch
from conftest import fresh_python
from fxcodegen.compat import vllm
from torch import fx

N_SEEDS = 240
SHAPE = (4,)


class FnModule(torch.nn.Module):
    """An opaque child wrapping a Python callable."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class Affine(torch.nn.Module):
    def __init__(self, a: float, b: float, n_out: int) -> None:
        super().__init__()
        self.a, self.b, self.n_out = a, b, n_out
        self.register_buffer("w", torch.linspace(-1.0, 1.0, SHAPE[0]))

    def forward(self, x: torch.Tensor, *rest: torch.Tensor, scale: float = 1.0) -> Any:
        y = x * self.a + self.b + self.w * scale
        for r in rest:
            y = y - r * 0.5
        if self.n_out == 1:
            return y
        return tuple(y + i for i in range(self.n_out))


def make_fn(n_out: int, k: float) -> Callable[..., Any]:
    def fn(x: torch.Tensor, *rest: torch.Tensor, **kw: Any) -> Any:
        y = torch.tanh(x) * k
        for r in rest:
            y = y + r.cos()
        y = y + float(len(kw))
        return y if n_out == 1 else tuple(y * (i + 1) for i in range(n_out))

    return fn


# --------------------------------------------------------------------- random graph building


def rand_float(rng: random.Random) -> float:
    return rng.choice([0.5, -1.25, 2.0, 0.0, -0.0, 1e-3, 3.0])


def tensor_op(rng: random.Random, g: fx.Graph, vals: list[fx.Node]) -> fx.Node:
    a = rng.choice(vals)
    b = rng.choice(vals)
    choice = rng.randrange(9)
    if choice == 0:
        return g.call_function(torch.ops.aten.add.Tensor, (a, b), {"alpha": rng.choice([1, 2, -1])})
    if choice == 1:
        return g.call_function(torch.ops.aten.mul.Tensor, (a, b))
    if choice == 2:
        return g.call_function(operator.add, (a, rand_float(rng)))
    if choice == 3:
        return g.call_function(torch.sin, (a,))
    if choice == 4:
        return g.call_method("sub", (a, b), {"alpha": rand_float(rng)})
    if choice == 5:
        return g.call_function(torch.clamp, (a,), {"min": -1.0, "max": rng.choice([1.0, None])})
    if choice == 6:
        return g.call_method(
            "to", (a,), {"dtype": torch.float32, "device": torch.device("cpu"), "copy": True}
        )
    if choice == 7:
        return g.call_function(torch.where, (g.call_function(operator.gt, (a, 0.0)), a, b))
    return g.call_function(operator.neg, (a,))


def random_body(
    rng: random.Random,
    g: fx.Graph,
    vals: list[fx.Node],
    root: torch.nn.Module,
    children: list[tuple[str, int]],
    n_steps: int,
) -> list[fx.Node]:
    """Appends random steps to ``g``; ``children`` are ``(attr name, n_out)`` callable here."""
    vals = list(vals)
    for _ in range(n_steps):
        if children and rng.random() < 0.45:
            name, n_out = rng.choice(children)
            n_args = rng.randint(1, 2)
            args = tuple(rng.choice(vals) for _ in range(n_args))
            child = getattr(root, name)
            kwargs: dict[str, Any] = {}
            if isinstance(child, fx.GraphModule):
                # An inlined child's parameters are p0, p1, ...; pass some by keyword.
                n_params = sum(1 for n in child.graph.nodes if n.op == "placeholder")
                args = tuple(rng.choice(vals) for _ in range(n_params))
                if n_params and rng.random() < 0.4:
                    kwargs = {f"p{n_params - 1}": args[-1]}
                    args = args[:-1]
            elif isinstance(child, Affine) and rng.random() < 0.5:
                kwargs = {"scale": rand_float(rng)}
            elif isinstance(child, FnModule) and rng.random() < 0.5:
                kwargs = {"flag": rng.choice([True, None, "s", (1,), torch.float32])}
            out = g.call_module(name, args, kwargs)
            if n_out == 1:
                vals.append(out)
            else:
                idxs = list(range(n_out))
                rng.shuffle(idxs)
                for i in idxs[: rng.randint(1, n_out)]:
                    vals.append(g.call_function(operator.getitem, (out, i)))
        else:
            vals.append(tensor_op(rng, g, vals))
    return vals


def inlined_child(
    rng: random.Random, depth: int, allow_opaque: bool, tag: str
) -> tuple[fx.GraphModule, int]:
    root = torch.nn.Module()
    kids: list[tuple[str, int]] = []
    if depth < 2 and rng.random() < 0.35:
        gkid, n = inlined_child(rng, depth + 1, allow_opaque, tag + "i")
        root.add_module(f"inner_{tag}", gkid)
        kids.append((f"inner_{tag}", n))
    if allow_opaque and rng.random() < 0.3:
        n = rng.choice([1, 2])
        root.add_module(f"op_{tag}", Affine(rand_float(rng), rand_float(rng), n))
        kids.append((f"op_{tag}", n))
    g = fx.Graph()
    n_params = rng.randint(1, 3)
    params = [g.placeholder(f"p{i}") for i in range(n_params)]
    vals = random_body(rng, g, params, root, kids, rng.randint(1, 4))
    n_out = rng.choice([1, 2, 3])
    if n_out == 1:
        g.output(vals[-1])
    else:
        g.output(tuple(rng.choice(vals) for _ in range(n_out)))
    return fx.GraphModule(root, g), n_out


def random_split_gm(
    seed: int, allow_opaque_in_inlined: bool, steps: int | None = None
) -> tuple[fx.GraphModule, int]:
    rng = random.Random(seed)
    root = torch.nn.Module()
    children: list[tuple[str, int]] = []
    for i in range(rng.randint(2, 6)):
        kind = rng.random()
        name = f"submod_{i}"
        if kind < 0.45:
            gm, n_out = inlined_child(rng, 0, allow_opaque_in_inlined, str(i))
            root.add_module(name, gm)
        elif kind < 0.75:
            n_out = rng.choice([1, 2, 3])
            root.add_module(name, Affine(rand_float(rng), rand_float(rng), n_out))
        else:
            n_out = rng.choice([1, 2])
            root.add_module(name, FnModule(make_fn(n_out, rand_float(rng))))
        children.append((name, n_out))
    g = fx.Graph()
    n_in = rng.randint(0, 3)
    ins = [g.placeholder(f"x{i}") for i in range(n_in)]
    if not ins:  # zero inputs: start from a constant
        ins = [g.call_function(torch.full, (SHAPE, 0.25))]
    vals = random_body(rng, g, ins, root, children, steps or rng.randint(3, 12))
    picks = [rng.choice(vals) for _ in range(rng.randint(1, 4))]
    shape = rng.randrange(4)
    if shape == 0:
        out: Any = picks[0]
    elif shape == 1:
        out = tuple(picks)
    elif shape == 2:
        out = [picks[0], {"rest": tuple(picks[1:]), "none": None}]
    else:
        out = (picks[0],)
    g.output(out)
    gm = fx.GraphModule(root, g)
    gm.graph.lint()
    return gm, n_in


def inputs_for(seed: int, n_in: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPE, generator=gen) for _ in range(n_in)]


def _norm_type(x: Any) -> type:
    # torch.fx.Interpreter returns output containers as fx's immutable list/dict.
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    t = type(x)
    return {immutable_list: list, immutable_dict: dict}.get(t, t)


def assert_same(a: Any, b: Any) -> None:
    assert _norm_type(a) is _norm_type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b) or torch.allclose(a, b, equal_nan=True, rtol=0, atol=0), (a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


def opaque_callables(gm: fx.GraphModule, names: list[str], bare: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        child = gm.get_submodule(name)
        if isinstance(child, fx.GraphModule):
            continue
        out[name] = child.fn if bare and isinstance(child, FnModule) else child
    return out


# --------------------------------------------------------------------- the tests


@pytest.mark.parametrize("chunk", range(4))
def test_native_matches_fx(chunk: int) -> None:
    per = N_SEEDS // 4
    n_inlined = n_opaque = n_nested = 0
    for seed in range(chunk * per, (chunk + 1) * per):
        gm, n_in = random_split_gm(seed, allow_opaque_in_inlined=True)
        xs = inputs_for(seed, n_in)
        want = gm(*xs)
        assert_same(fx.Interpreter(gm).run(*xs), want)
        gen = fxcodegen.generate(gm)
        n_inlined += gen.code.count("def __fx_f")
        n_opaque += len(gen.submod_names) - gen.code.count("def __fx_f")
        n_nested += sum("." in n for n in gen.submod_names)
        fn = fxcodegen.compile_execution_fn(
            gen.code,
            opaque_callables(gm, gen.submod_names, bare=seed % 2 == 0),
            gen.submod_names,
            gen.consts,
        )
        try:
            assert_same(fn(*xs), want)
            assert_same(fxcodegen.build(gm)(*xs), want)
            # and the serialized node list gives the same code
            assert fxcodegen.emit(fxcodegen.serialize(gm)) == (gen.code, gen.submod_names)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}\n{gm.code}\n{gen.code}") from e
    # The generator really covers the mix the test is about.
    assert n_inlined >= per and n_opaque >= per and n_nested >= 3


@pytest.mark.parametrize("chunk", range(2))
def test_vllm_matches_fx(chunk: int) -> None:
    per = N_SEEDS // 2
    for seed in range(chunk * per, (chunk + 1) * per):
        gm, n_in = random_split_gm(10_000 + seed, allow_opaque_in_inlined=False)
        xs = inputs_for(seed, n_in)
        want = fx.Interpreter(gm).run(*xs)
        code, names, consts = vllm.generate_execution_code(gm)
        fn = vllm.compile_execution_fn(
            code, opaque_callables(gm, names, bare=seed % 3 == 0), names, consts
        )
        try:
            assert_same(fn(*xs), want)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}\n{gm.code}\n{code}") from e


def test_large_graph_matches_fx_and_a_fresh_process() -> None:
    """A graph of 16,384+ nodes: the code runs like the graph, and a fresh process writes the
    same code."""
    seed, steps = 7, 11_500
    gm, n_in = random_split_gm(seed, allow_opaque_in_inlined=True, steps=steps)
    assert len(gm.graph.nodes) >= 16_384
    xs = inputs_for(seed, n_in)
    want = fx.Interpreter(gm).run(*xs)
    gen = fxcodegen.generate(gm)
    fn = fxcodegen.compile_execution_fn(
        gen.code, opaque_callables(gm, gen.submod_names, bare=False), gen.submod_names, gen.consts
    )
    assert_same(fn(*xs), want)
    one = fresh_process_code_hash(
        f"fxcodegen.generate(T.random_split_gm({seed}, True, steps={steps})[0]).code"
    )
    assert one == hashlib.sha256(gen.code.encode()).hexdigest()


def fresh_process_code_hash(code_expr: str) -> str:
    """The sha256 of the code that ``code_expr`` evaluates to in a fresh process (``T`` is this
    module, ``vllm`` the compat surface): the code does not depend on the process."""
    return fresh_code_hash(code_expr, {}).stdout.strip()


def fresh_code_hash(code_expr: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A fresh process with ``env`` printing the sha256 of the code ``code_expr`` evaluates to
    (see :func:`fresh_process_code_hash`)."""
    script = (
        "import hashlib, sys; sys.path.insert(0, sys.argv[1]);"
        "import fxcodegen, test_codegen_differential as T; from fxcodegen.compat import vllm;"
        f"print(hashlib.sha256(({code_expr}).encode()).hexdigest())"
    )
    return fresh_python(script, env, str(Path(__file__).parent), check=True)


AWKWARD_NAMES = ["torch", "del", "sum", "execution_fn", "__fx_s0", "a-b", "1st", "x", "torch_1"]


def awkward_large_gm(n: int = 16_500) -> fx.GraphModule:
    """A chain of ``n`` adds whose node names need renaming (reserved, keywords, builtins, the
    entry function, the layout prefix, non-identifiers, repeats), each also using a value far
    back, so names and last uses are both non-trivial."""
    g = fx.Graph()
    x = g.placeholder("x")
    made = [x]
    for k in range(n):
        node = g.call_function(operator.add, (made[-1], made[k * 7 % len(made)]))
        node.name = AWKWARD_NAMES[k % len(AWKWARD_NAMES)]
        made.append(node)
    g.output(made[-1])
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("surface", ["native", "vllm"])
def test_large_graph_with_awkward_names_runs_like_the_graph(surface: str) -> None:
    """With names that all need care, a large graph's code runs like the graph and is the same
    in a fresh process."""
    gm = awkward_large_gm()
    x = torch.tensor([1.0], dtype=torch.float64)
    if surface == "native":
        gen = fxcodegen.generate(gm)
        code = gen.code
        fn = fxcodegen.compile_execution_fn(code, {}, gen.submod_names, gen.consts)
    else:
        code, names, consts = vllm.generate_execution_code(gm)
        fn = vllm.compile_execution_fn(code, [], names, consts)
    assert "torch_1_1 = " in code  # a rename of a rename
    assert ("v__fx_s0 = " in code) == (surface == "native")  # only native reserves __fx_
    assert_same(fn(x), fx.Interpreter(gm).run(x))
    expr = (
        "fxcodegen.generate(T.awkward_large_gm()).code"
        if surface == "native"
        else "vllm.generate_execution_code(T.awkward_large_gm())[0]"
    )
    assert fresh_process_code_hash(expr) == hashlib.sha256(code.encode()).hexdigest()
