"""``fxcodegen.compat.vllm``: a drop-in for ``vllm.compilation.codegen`` (names, signatures,
generated layout) with fxcodegen's semantics. Semantics on this surface are also covered by
the ``vllm`` parametrization of test_codegen_semantics.py and test_codegen_differential.py."""

from __future__ import annotations

import ast
import functools
import inspect
import operator
import re

import pytest
import torch
from conftest import raw_gm
from fxcodegen.compat import vllm
from torch import fx


class Opaque(torch.nn.Module):
    def __init__(self, k: float = 1.0) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * self.k, x + sum(rest, torch.zeros(())))


def split_gm() -> fx.GraphModule:
    cg = fx.Graph()
    a = cg.placeholder("a")
    b = cg.call_function(torch.ops.aten.add.Tensor, (a, 1))
    c = cg.call_method("to", (b,), {"device": torch.device("cpu")})
    cg.output((c,))
    root = torch.nn.Module()
    root.submod_0 = Opaque(2.0)
    root.submod_1 = fx.GraphModule(torch.nn.Module(), cg)
    root.submod_2 = Opaque(3.0)
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    s0 = g.call_module("submod_0", (x, y))
    g0 = g.call_function(operator.getitem, (s0, 0))
    g1 = g.call_function(operator.getitem, (s0, 1))
    s1 = g.call_module("submod_1", (g0,))
    h = g.call_function(operator.getitem, (s1, 0))
    s2 = g.call_module("submod_2", (h, g1))
    out = g.call_function(operator.getitem, (s2, 1))
    g.output((out, h))
    return fx.GraphModule(root, g)


def reference(gm: fx.GraphModule, *xs: torch.Tensor) -> object:
    return gm(*xs)


def test_public_names_and_signatures() -> None:
    assert set(vllm.__all__) >= {
        "generate_execution_code",
        "generate_execution_code_with_name",
        "compile_execution_fn",
        "_node_ref",
    }
    sig = inspect.signature(vllm.generate_execution_code)
    assert list(sig.parameters) == ["split_gm"]
    sig = inspect.signature(vllm.generate_execution_code_with_name)
    assert list(sig.parameters) == ["split_gm", "fn_name", "with_submod", "consts", "const_index"]
    assert sig.parameters["consts"].default is None
    assert sig.parameters["const_index"].default is None
    sig = inspect.signature(vllm.compile_execution_fn)
    assert list(sig.parameters) == ["code", "submod_callables", "submod_names", "consts"]
    assert sig.parameters["consts"].default is None
    assert list(inspect.signature(vllm._node_ref).parameters) == ["arg", "consts", "const_index"]


def test_generated_layout_names() -> None:
    gm = split_gm()
    code, names, consts = vllm.generate_execution_code(gm)
    assert code.startswith("import torch\nimport operator\n")
    assert names == ["submod_0", "submod_1", "submod_2"]
    assert consts == [torch.device("cpu")]
    assert "def execution_fn(x, y, *, __vllm_submods__):" in code
    assert "def __vllm_inlined_submods__1(a):" in code
    assert "__vllm_submods__[0](x, y)" in code and "__vllm_submods__[2](" in code
    assert "__vllm_inlined_submods__1(getitem)" in code
    assert "__vllm_consts__[0]" in code
    assert "__fx_" not in code
    # del lines are exactly `    del a, b`
    for line in code.splitlines():
        if line.lstrip().startswith("del"):
            assert re.fullmatch(r"    del [A-Za-z_]\w*(, [A-Za-z_]\w*)*", line), line


def test_compile_execution_fn_returns_partial() -> None:
    gm = split_gm()
    code, names, consts = vllm.generate_execution_code(gm)
    callables = {"submod_0": gm.submod_0, "submod_2": gm.submod_2}
    fn = vllm.compile_execution_fn(code, callables, names, consts)
    assert isinstance(fn, functools.partial)
    assert list(fn.keywords) == ["__vllm_submods__"]
    subs = fn.keywords["__vllm_submods__"]
    assert len(subs) == 3 and subs[1] is None  # inlined child: no callable
    assert subs[0] is not None and subs[2] is not None
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(fn(x, y), reference(gm, x, y))
    # Plain Python callables are accepted too.
    calls = []

    def py0(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append("py0")
        return gm.submod_0(a, b)

    fn = vllm.compile_execution_fn(code, {"submod_0": py0, "submod_2": gm.submod_2}, names, consts)
    torch.testing.assert_close(fn(x, y), reference(gm, x, y))
    assert calls == ["py0"]


def test_with_submod_false_rejects_call_module() -> None:
    with pytest.raises(RuntimeError, match="call_module is not allowed"):
        vllm.generate_execution_code_with_name(split_gm(), "fn", with_submod=False)


def test_with_submod_false_without_call_module() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.mul, (x, torch.float32.itemsize)))
    code, names, consts = vllm.generate_execution_code_with_name(raw_gm(g), "my_fn", False)
    assert names == [] and consts == []
    assert "def my_fn(x):" in code and "__vllm_submods__" not in code
    ns = {"torch": torch, "operator": operator}
    exec(compile(code, "<t>", "exec"), ns)
    assert ns["my_fn"](3) == 12


def test_opaque_call_inside_inlined_child_rejected() -> None:
    inner = torch.nn.Module()
    inner.op = Opaque()
    cg = fx.Graph()
    a = cg.placeholder("a")
    cg.output(cg.call_module("op", (a,)))
    root = torch.nn.Module()
    root.child = fx.GraphModule(inner, cg)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("child", (x,)))
    with pytest.raises(RuntimeError, match="call_module is not allowed"):
        vllm.generate_execution_code(fx.GraphModule(root, g))


def test_consts_and_const_index_extended_in_place() -> None:
    keep = object()
    dev = torch.device("cpu")
    consts: list = [keep]
    const_index: dict = {id(keep): 0}
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.getitem, (x, slice(1)))
    g.output((a, keep, dev))
    code, names, out = vllm.generate_execution_code_with_name(
        raw_gm(g), "execution_fn", True, consts, const_index
    )
    assert out is consts
    assert consts[0] is keep and len(consts) == 3
    assert consts[2] is dev and consts[1] == slice(1)
    assert const_index[id(keep)] == 0 and const_index[id(dev)] == 2
    assert const_index[id(consts[1])] == 1
    assert "__vllm_consts__[0]" in code and "__vllm_consts__[2]" in code
    fn = vllm.compile_execution_fn("import torch\nimport operator\n" + code, {}, names, consts)
    r = fn([10, 20])
    assert r[0] == [10] and r[1] is keep and r[2] is dev


def test_const_index_names_only_objects_the_pool_holds() -> None:
    # Equal devices share a slot, but only the pooled object's id may enter the index: the
    # other's id can be reused once it dies, and a later call would then find a wrong slot.
    first, second = torch.device("cpu"), torch.device("cpu")
    assert first is not second
    consts: list = []
    const_index: dict = {}
    g = fx.Graph()
    g.output((first, second))
    code, _, out = vllm.generate_execution_code_with_name(
        raw_gm(g), "execution_fn", True, consts, const_index
    )
    assert out == [first] and out[0] is first
    assert const_index == {id(first): 0}
    assert code.count("__vllm_consts__[0]") == 2


def test_node_ref() -> None:
    g = fx.Graph()
    x = g.placeholder("some_node")
    obj = object()
    dev = torch.device("cpu")
    consts: list = []
    const_index: dict = {}
    assert vllm._node_ref(x, consts, const_index) == "some_node"
    assert vllm._node_ref(3, consts, const_index) == "3"
    assert vllm._node_ref(True, consts, const_index) == "True"
    assert vllm._node_ref(None, consts, const_index) == "None"
    assert vllm._node_ref("a'b", consts, const_index) == '"a\'b"'
    assert vllm._node_ref(-0.0, consts, const_index) == "-0.0"
    assert vllm._node_ref(float("inf"), consts, const_index) == "float('inf')"
    assert vllm._node_ref((1,), consts, const_index) == "(1,)"
    assert consts == [] and const_index == {}
    assert vllm._node_ref(obj, consts, const_index) == "__vllm_consts__[0]"
    assert consts == [obj] and const_index == {id(obj): 0}
    assert vllm._node_ref(obj, consts, const_index) == "__vllm_consts__[0]"
    assert len(consts) == 1
    text = vllm._node_ref([x, {"d": dev}, (obj,)], consts, const_index)
    assert text == "[some_node, {'d': __vllm_consts__[1]}, (__vllm_consts__[0],)]"
    assert consts == [obj, dev] and const_index[id(dev)] == 1
    # Every text reads back as the value (with the pool bound).
    ns = {"__vllm_consts__": consts, "some_node": 7}
    for value in [5, 2**70, "x\n\x00", b"\xff", 1.5, (1,), [None, False], {"k": 1.0}, obj, dev]:
        text = vllm._node_ref(value, consts, const_index)
        back = eval(text, ns)  # generated text under test
        assert back == value and type(back) is type(value)


def test_del_form_and_inlined_dels() -> None:
    code, _, _ = vllm.generate_execution_code(split_gm())
    tree = ast.parse(code)
    fns = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert set(fns) == {"execution_fn", "__vllm_inlined_submods__1"}
    dels = [s for f in fns.values() for s in f.body if isinstance(s, ast.Delete)]
    assert dels and all(all(isinstance(t, ast.Name) for t in d.targets) for d in dels)


def test_consts_none_loads_pool_free_code() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.aten.neg.default, (x,)))
    code, names, consts = vllm.generate_execution_code(raw_gm(g))
    assert consts == []
    fn = vllm.compile_execution_fn(code, {}, names)
    torch.testing.assert_close(fn(torch.ones(2)), -torch.ones(2))


def test_same_results_as_native() -> None:
    import fxcodegen

    gm = split_gm()
    x, y = torch.randn(3), torch.randn(3)
    code, names, consts = vllm.generate_execution_code(gm)
    fn = vllm.compile_execution_fn(
        code, {"submod_0": gm.submod_0, "submod_2": gm.submod_2}, names, consts
    )
    native = fxcodegen.generate(gm)
    assert native.submod_names == names
    assert len(native.consts) == len(consts) and all(
        a is b for a, b in zip(native.consts, consts, strict=True)
    )
    torch.testing.assert_close(fn(x, y), fxcodegen.build(gm)(x, y))
