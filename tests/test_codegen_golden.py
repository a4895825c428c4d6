"""Golden tests: the exact emitted source of small graphs, native and vLLM layout.

Regenerate with ``FXCODEGEN_REGEN_GOLDEN=1 pytest tests/test_codegen_golden.py`` (off by
default; review the diff before committing).
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable
from pathlib import Path

import fxcodegen
import pytest
import torch
from conftest import raw_gm
from fxcodegen.compat import vllm
from torch import fx

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("FXCODEGEN_REGEN_GOLDEN") == "1"


class Opaque(torch.nn.Module):
    def forward(self, *args: object, **kwargs: object) -> object:
        return args


def simple_chain() -> fx.GraphModule:
    """Two opaque pieces, getitem, del lines, a returned placeholder."""
    root = torch.nn.Module()
    root.submod_0 = Opaque()
    root.submod_1 = Opaque()
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    a = g.call_module("submod_0", (x, y))
    a0 = g.call_function(operator.getitem, (a, 0))
    a1 = g.call_function(operator.getitem, (a, 1))
    b = g.call_module("submod_1", (a0,), {"scale": 2.0})
    g.output((b, a1, x))
    return fx.GraphModule(root, g)


def inlined_child() -> fx.GraphModule:
    """A plain GraphModule child inlined; pooled device shared with the root."""
    cg = fx.Graph()
    p = cg.placeholder("inp")
    q = cg.call_function(torch.ops.aten.mul.Tensor, (p, 3))
    r = cg.call_method("to", (q,), {"device": torch.device("cpu")})
    cg.output((r, q))
    root = torch.nn.Module()
    root.submod_0 = Opaque()
    root.submod_1 = fx.GraphModule(torch.nn.Module(), cg)
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_module("submod_0", (x,), {"device": torch.device("cpu")})
    a0 = g.call_function(operator.getitem, (a, 0))
    b = g.call_module("submod_1", (a0,))
    b0 = g.call_function(operator.getitem, (b, 0))
    g.output(b0)
    return fx.GraphModule(root, g)


def literals() -> fx.GraphModule:
    """Literal printing: big ints, bools, floats incl. non-finite, strings, bytes, containers."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=-0.0)
    n = g.call_function(
        torch.ops.aten.add.Tensor,
        (x, y),
        {"alpha": 1},
    )
    m = g.call_function(
        operator.getitem,
        (
            {
                "big": 2**80,
                "neg": -(2**64),
                "b": (True, False, None),
                "f": [math.inf, -math.inf, math.nan, 1e16, 0.1, 5e-324],
                "s": 'it\'s "q"\n\x00é😀',
                "by": b"\x00'\xff",
                "one": (n,),
            },
            "one",
        ),
    )
    g.output(m)
    return fx.GraphModule(torch.nn.Module(), g)


def names_and_kwargs() -> fx.GraphModule:
    """Colliding names (torch, len, the layout's own) and keyword / non-identifier kwargs."""
    root = torch.nn.Module()
    root.submod_0 = Opaque()
    g = fx.Graph()
    t = g.placeholder("a")
    t.name = "torch"
    ln = g.placeholder("b")
    ln.name = "len"
    own = g.placeholder("c")
    own.name = "__fx_c0"
    vl = g.placeholder("d")
    vl.name = "__vllm_submods__"
    s = g.call_module("submod_0", (t, ln), {"lambda": own, "a b": vl, "ok": 1})
    r = g.call_function(len, (s,))
    g.output(r)
    return raw_gm(g, root)


def pooled_targets() -> fx.GraphModule:
    """math.* and slices / Ellipsis / dtypes go to the pool; getitem with odd indices."""
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(math.sqrt, (2.0,))
    b = g.call_function(operator.getitem, (x, (Ellipsis, slice(None, 2))))
    c = g.call_method("to", (b,), {"dtype": torch.float16})
    d = g.call_function(operator.mul, (c, a))
    e = g.call_function(operator.getitem, (x, Ellipsis))
    g.output([d, e])
    return fx.GraphModule(torch.nn.Module(), g)


CASES: dict[str, Callable[[], fx.GraphModule]] = {
    "simple_chain": simple_chain,
    "inlined_child": inlined_child,
    "literals": literals,
    "names_and_kwargs": names_and_kwargs,
    "pooled_targets": pooled_targets,
}


def emitted(case: str, layout: str) -> str:
    gm = CASES[case]()
    if layout == "native":
        return fxcodegen.generate(gm).code
    return vllm.generate_execution_code(gm)[0]


@pytest.mark.parametrize("layout", ["native", "vllm"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, layout: str) -> None:
    path = GOLDEN / f"{case}.{layout}.py"
    code = emitted(case, layout)
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(code)
    assert path.exists(), f"missing golden file {path}; run with FXCODEGEN_REGEN_GOLDEN=1"
    assert code == path.read_text(), f"emitted code for {case} ({layout}) changed"
    compile(code, str(path), "exec")


def test_golden_files_have_no_strays() -> None:
    expected = {f"{c}.{layout}.py" for c in CASES for layout in ("native", "vllm")}
    assert {p.name for p in GOLDEN.glob("*.py")} == expected
