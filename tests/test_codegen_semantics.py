"""Issue 2, "Semantics users rely on": literals, the pool, call targets, node kinds, names,
memory, determinism, tracebacks and errors, on both the native and the vLLM surface.

Every property is checked by running the generated code (values reach the callee equal and of
the same type); string checks come on top, never instead.
"""

from __future__ import annotations

import ast
import enum
import gc
import math
import operator
import struct
import traceback
import weakref
from typing import Any

import fxcodegen
import pytest
import torch
from conftest import (
    SURFACES,
    compile_surface,
    fresh_python,
    generate_surface,
    raw_gm,
    run_in_threads,
)
from fxcodegen import CodegenError
from torch import fx

# ----------------------------------------------------------------------------- helpers

RECEIVED: list[tuple[tuple[Any, ...], dict[str, Any]]] = []


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A user function (goes to the pool) that records what reached it."""
    RECEIVED.append((args, kwargs))
    return args, kwargs


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type, recursively; floats bit-for-bit (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            same(ka, kb) and same(a[ka], b[kb]) for ka, kb in zip(a, b, strict=True)
        )
    return a == b


def call_graph(*args: Any, **kwargs: Any) -> fx.GraphModule:
    """``def f(x): return capture(*args, **kwargs)``."""
    g = fx.Graph()
    g.placeholder("x")
    node = g.call_function(capture, args, kwargs)
    g.output(node)
    return raw_gm(g)


def pool_refs(code: str, surface: str) -> set[int]:
    """The pool slots the code refers to."""
    refs: set[int] = set()
    for node in ast.walk(ast.parse(code)):
        if surface == "native" and isinstance(node, ast.Name) and node.id.startswith("__fx_c"):
            refs.add(int(node.id[len("__fx_c") :]))
        if (
            surface == "vllm"
            and isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "__vllm_consts__"
        ):
            assert isinstance(node.slice, ast.Constant)
            refs.add(node.slice.value)
    return refs


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


class MyStr(str):
    pass


class MyFloat(float):
    pass


# ----------------------------------------------------------------------------- literals

LITERALS = [
    0,
    1,
    -1,
    2**63 - 1,
    -(2**63),
    2**63,
    -(2**63) - 1,
    10**100,
    -(10**100),
    True,
    False,
    None,
    "",
    "plain",
    "it's",
    'say "hi"',
    "both ' and \"",
    "back\\slash",
    "\n\r\t\x0b\x0c",
    "nul\x00byte",
    "\x7f\x80\x85\xa0\xff",
    "é€",
    "\U0001f600 astral",
    "\u2028\u2029",
    "x); import os; (",
    "'''\"\"\"",
    b"",
    b"plain",
    bytes(range(256)),
    b'it\'s "quoted" \\',
    0.0,
    -0.0,
    1.0,
    -2.5,
    0.1,
    1e16,
    1e-5,
    5e-324,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    (),
    (1,),
    ((1,),),
    (None, True, 1),
    [],
    [1, [2, [3.5, "s"]]],
    {},
    {"a": 1, 2: "b", None: [True], (1,): {"n": -0.0}},
    {b"k": (math.inf,)},
]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("value", LITERALS, ids=repr)
def test_literal_round_trip_inline(value: Any, surface: str) -> None:
    gm = call_graph(value, kw=value)
    code, _, consts = generate_surface(gm, surface)
    # Only the callee is pooled: the literal is written inline.
    assert consts == [capture]
    assert pool_refs(code, surface) == {0}
    fn = compile_surface(gm, surface)
    args, kwargs = fn(None)
    assert same(args[0], value), (args[0], value)
    assert same(kwargs["kw"], value)


def test_source_of_many_mebibytes_is_whole() -> None:
    # 9 MiB of literal: past the size where the source's str is filled with a helper thread
    # populating its pages.
    big = "ab\x00c" * (9 << 18)
    code = fxcodegen.generate(call_graph(big)).code
    assert len(code) > 9 << 20 and code.isascii()
    args, _ = compile_surface(call_graph(big), "native")(None)
    assert args == (big,)


@pytest.mark.parametrize("surface", SURFACES)
def test_bool_and_int_stay_distinct(surface: str) -> None:
    values = (True, 1, False, 0, 1.0, [True, 1], {True: 1, 0: False})
    fn = compile_surface(call_graph(*values), surface)
    args, _ = fn(None)
    assert [type(a) for a in args] == [bool, int, bool, int, float, list, dict]
    assert [type(a) for a in args[5]] == [bool, int]
    assert [(type(k), type(v)) for k, v in args[6].items()] == [(bool, int), (int, bool)]


@pytest.mark.parametrize("surface", SURFACES)
def test_negative_zero_and_nonfinite(surface: str) -> None:
    gm = call_graph(-0.0, math.inf, -math.inf, math.nan, [(-0.0,)])
    code, _, _ = generate_surface(gm, surface)
    assert "-0.0" in code
    args, _ = compile_surface(gm, surface)(None)
    assert math.copysign(1.0, args[0]) == -1.0
    assert args[1] == math.inf and args[2] == -math.inf and math.isnan(args[3])
    assert math.copysign(1.0, args[4][0][0]) == -1.0


@pytest.mark.parametrize("surface", SURFACES)
def test_random_floats_round_trip(surface: str) -> None:
    import random

    rng = random.Random(1234)
    values = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(2000)]
    values += [rng.uniform(-1e6, 1e6) for _ in range(500)]
    values += [float(f"1e{e}") for e in range(-330, 310)] + [2.0**e for e in range(-1074, 1024, 7)]
    args, _ = compile_surface(call_graph(*values), surface)(None)
    bad = [(v, r) for v, r in zip(values, args, strict=True) if not same(v, r)]
    assert not bad, bad[:10]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize(
    "value", ["\ud800", "a\udfffb", "\udc80\x00'"], ids=["lone-high", "lone-low", "mixed"]
)
def test_lone_surrogates_go_to_pool(value: str, surface: str) -> None:
    gm = call_graph(value, [value])
    code, _, consts = generate_surface(gm, surface)
    assert value in consts
    args, _ = compile_surface(gm, surface)(None)
    assert args[0] == value and type(args[0]) is str
    assert args[1] == [value]


@pytest.mark.parametrize("surface", SURFACES)
def test_one_element_tuples_keep_comma(surface: str) -> None:
    gm = call_graph((1,), ((2,),), [(3,)], {"k": ("v",)})
    code, _, _ = generate_surface(gm, surface)
    assert "(1,)" in code and "((2,),)" in code
    args, _ = compile_surface(gm, surface)(None)
    assert same(args, ((1,), ((2,),), [(3,)], {"k": ("v",)}))


@pytest.mark.parametrize("surface", SURFACES)
def test_literal_receivers(surface: str) -> None:
    """Numbers in receiver position (``x.m()``) must not parse as something else."""
    g = fx.Graph()
    g.placeholder("x")
    outs = [
        g.call_method("bit_length", (-1,)),
        g.call_method("bit_length", (-(10**30),)),
        g.call_method("hex", (-0.0,)),
        g.call_method("hex", (-math.inf,)),
        g.call_method("upper", ("ab",)),
        g.call_method("count", ((1,), 1)),
        g.call_method("get", ({"a": 2}, "a")),
        g.call_method("conjugate", (True,)),
    ]
    g.output(tuple(outs))
    fn = compile_surface(raw_gm(g), surface)
    assert fn(None) == (1, (10**30).bit_length(), (-0.0).hex(), (-math.inf).hex(), "AB", 1, 2, 1)


# ----------------------------------------------------------------------------- the pool


def pool_values() -> list[Any]:
    from torch.distributed.tensor.placement_types import Replicate, Shard

    return [
        torch.device("cpu"),
        torch.float16,
        torch.strided,
        torch.channels_last,
        torch.contiguous_format,
        Color.RED,
        Level.LOW,
        slice(1, 3),
        slice(None),
        Ellipsis,
        1 + 2j,
        frozenset({1, 2}),
        object(),
        MyStr("sub"),
        MyFloat(1.5),
        Shard(0),
        Replicate(),
        capture,
        torch.ones(2),
    ]


@pytest.mark.parametrize("surface", SURFACES)
def test_pooled_values_reach_callee_by_identity(surface: str) -> None:
    values = pool_values()
    gm = call_graph(*values, **{f"k{i}": v for i, v in enumerate(values)})
    code, _, consts = generate_surface(gm, surface)
    # Callee first, then each object once, in order of first appearance. (fx rebuilds slices
    # when it stores node arguments, so identity is checked against the node's own objects.)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    expected: list[Any] = [capture]
    for obj in [*node.args, *node.kwargs.values()]:
        if not any(obj is e for e in expected):
            expected.append(obj)
    assert len(consts) == len(expected)
    assert all(a is b for a, b in zip(consts, expected, strict=True))
    args, kwargs = compile_surface(gm, surface)(None)
    for i, v in enumerate(values):
        assert args[i] is node.args[i] and kwargs[f"k{i}"] is node.kwargs[f"k{i}"]
        if isinstance(v, slice):
            assert args[i] == v and kwargs[f"k{i}"] == v
        else:
            assert args[i] is v and kwargs[f"k{i}"] is v, (i, v)
    # Nothing pooled is written as a literal.
    assert "Ellipsis" not in code and "slice(" not in code and "device(" not in code


@pytest.mark.parametrize("surface", SURFACES)
def test_same_object_one_slot_and_first_appearance_order(surface: str) -> None:
    a, b, c = Color.RED, object(), torch.float64
    g = fx.Graph()
    x = g.placeholder("x")
    n1 = g.call_function(capture, (b, a, b), {"z": c})
    n2 = g.call_function(capture, (x, a, c, n1))
    n3 = g.call_function(operator.getitem, (n2, 0))
    g.output(n3)
    code, _, consts = generate_surface(raw_gm(g), surface)
    assert consts == [capture, b, a, c]
    assert all(p is q for p, q in zip(consts, [capture, b, a, c], strict=True))


@pytest.mark.parametrize("surface", SURFACES)
def test_equal_devices_share_a_slot(surface: str) -> None:
    d1, d2, d3 = torch.device("cpu"), torch.device("cpu"), torch.device("meta")
    assert d1 is not d2
    gm = call_graph(d1, d2, d3, torch.device("cpu"))
    _, _, consts = generate_surface(gm, surface)
    assert consts[1:] == [torch.device("cpu"), torch.device("meta")]
    args, _ = compile_surface(gm, surface)(None)
    assert args == (d1, d1, d3, d1)


@pytest.mark.parametrize("surface", SURFACES)
def test_devices_share_a_slot_only_when_equal(surface: str) -> None:
    # Devices differing in type only, in index only, and by no index against index 0, each
    # made anew (no CUDA needed to make one).
    specs = [("cpu",), ("cpu", 0), ("cuda",), ("cuda", 0), ("cuda", 1), ("cuda", 7), ("meta",)]
    devices = [torch.device(*spec) for spec in specs + specs[::-1]]
    gm = call_graph(*devices)
    _, _, consts = generate_surface(gm, surface)
    assert consts[1:] == [torch.device(*spec) for spec in specs]
    args, _ = compile_surface(gm, surface)(None)
    assert args == tuple(devices)
    assert [str(a) for a in args] == [str(d) for d in devices]


class TracedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x).to(torch.device("cpu"), dtype=torch.float32)
        z = torch.zeros_like(x, device=torch.device("cpu"), dtype=torch.float64)
        return y[..., 1:3] + z[:, 1:3].to(torch.float32) + math.sqrt(2.0)


@pytest.mark.parametrize("surface", SURFACES)
def test_two_traces_give_equal_pools_and_code(surface: str) -> None:
    model = TracedModel()
    gm1 = fx.symbolic_trace(model)
    gm2 = fx.symbolic_trace(model)
    code1, names1, consts1 = generate_surface(gm1, surface)
    code2, names2, consts2 = generate_surface(gm2, surface)
    assert code1 == code2
    assert names1 == names2 == ["lin"]
    assert consts1 == consts2
    assert len(consts1) >= 3  # devices, dtypes, slices / Ellipsis
    x = torch.randn(2, 4)
    torch.testing.assert_close(compile_surface(gm1, surface)(x), model(x))


@pytest.mark.parametrize("surface", SURFACES)
def test_one_pool_shared_by_root_and_inlined_children(surface: str) -> None:
    dev = torch.device("cpu")
    sl = object()

    def child_graph() -> fx.GraphModule:
        g = fx.Graph()
        a = g.placeholder("a")
        g.output(g.call_function(capture, (a, dev, sl, torch.device("cpu"))))
        return raw_gm(g)

    root = torch.nn.Module()
    root.c0 = child_graph()
    root.c1 = child_graph()
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(capture, (x, torch.device("cpu")))
    s0 = g.call_module("c0", (r,))
    s1 = g.call_module("c1", (s0,))
    g.output((s1, g.call_function(capture, (dev,))))
    gm = raw_gm(g, root)
    code, names, consts = generate_surface(gm, surface)
    assert names == ["c0", "c1"]
    assert len(consts) == 3
    assert consts[0] is capture and consts[1] == dev and consts[2] is sl
    assert pool_refs(code, surface) == {0, 1, 2}
    tree = ast.parse(code)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert len(fns) == 3
    for f in fns:  # every function refers to the one pool
        assert pool_refs(ast.unparse(f), surface)
    out = compile_surface(gm, surface)(7)
    s1_args = out[0][0]
    assert s1_args[1] == dev and s1_args[2] is sl
    assert out[0][0][0][0][0] == ((7, dev), {})
    assert out[1] == ((dev,), {})


# ----------------------------------------------------------------------------- call targets


def user_fn(a: Any, b: Any) -> Any:
    return a + b


def _make_closure() -> Any:
    k = 10

    def closure(a: Any) -> Any:
        return a + k

    return closure


def fake_builtin_len(x: Any) -> int:
    return -1


fake_builtin_len.__module__ = "builtins"
fake_builtin_len.__name__ = "len"
fake_builtin_len.__qualname__ = "len"


def fake_operator_add(a: Any, b: Any) -> str:
    return "fake"


fake_operator_add.__module__ = "_operator"
fake_operator_add.__name__ = "add"


def fake_torch_add(a: Any, b: Any) -> str:
    return "fake-torch"


fake_torch_add.__module__ = "torch"
fake_torch_add.__name__ = "add"
fake_torch_add.__qualname__ = "add"


def dotted_callees(code: str) -> list[str]:
    """Every call whose callee is a plain dotted name (not the pool, not a submodule)."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            f = node.func
            parts = []
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
                out.append(".".join(reversed(parts)))
    return out


@pytest.mark.parametrize("surface", SURFACES)
def test_call_targets_by_name_or_pool(surface: str) -> None:
    closure = _make_closure()
    lam = lambda a: a * 3  # noqa: E731
    g = fx.Graph()
    x = g.placeholder("x")
    t = torch.tensor([4.0])
    vals = [
        g.call_function(torch.ops.aten.add.Tensor, (x, x)),
        g.call_function(torch.ops.aten.mul, (x, 2)),
        g.call_function(operator.add, (x, 1)),
        g.call_function(operator.neg, (x,)),
        g.call_function(len, ([1, 2],)),
        g.call_function(math.sqrt, (16.0,)),
        g.call_function(math.floor, (2.5,)),
        g.call_function(user_fn, (1, 2)),
        g.call_function(closure, (1,)),
        g.call_function(lam, (1,)),
        g.call_function(fake_builtin_len, ([1],)),
        g.call_function(fake_operator_add, (1, 2)),
        g.call_function(fake_torch_add, (1, 2)),
        g.call_function(torch.relu, (x,)),
        g.call_function(torch.nn.functional.relu, (x,)),
        g.call_function(getattr, (t, "shape")),
    ]
    g.output(tuple(vals))
    gm = raw_gm(g)
    code, _, consts = generate_surface(gm, surface)
    named = dotted_callees(code)
    assert "torch.ops.aten.add.Tensor" in named
    assert "operator.add" in named and "operator.neg" in named
    assert "len" in named
    for pooled in (math.sqrt, math.floor, user_fn, closure, lam):
        assert any(c is pooled for c in consts), pooled
    for fake in (fake_builtin_len, fake_operator_add, fake_torch_add):
        assert any(c is fake for c in consts), fake
    # Every name written resolves to the very target where the code runs.
    ns = {"torch": torch, "operator": operator, **vars(__import__("builtins"))}
    targets = {id(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    for text in named:
        if text.startswith(("__fx_", "__vllm_")):
            continue
        obj = eval(text, ns)  # dotted names checked above
        assert id(obj) in targets, text
    x_val = torch.tensor([1.0, -2.0])
    got = compile_surface(gm, surface)(x_val)
    want = fx.Interpreter(gm).run(x_val)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b
    assert got[10] == -1 and got[11] == "fake" and got[12] == "fake-torch"


def _two_targets_gm() -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.mul, (x, 3)), g.call_function(user_fn, (1, 2))))
    return raw_gm(g)


def test_kept_names_are_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    gm = _two_targets_gm()
    mul = operator.mul
    assert "operator.mul(" in fxcodegen.generate(gm).code
    # Once `operator.mul` names another object, the kept name no longer leads to the target:
    # it goes to the pool, and the code still calls the original.
    monkeypatch.setattr(operator, "mul", lambda a, b: "impostor")
    code, names, consts = fxcodegen.generate(gm)
    assert "operator.mul(" not in code and any(c is mul for c in consts)
    out = fxcodegen.compile_execution_fn(code, {}, names, consts)(torch.tensor([2.0]))
    torch.testing.assert_close(out[0], torch.tensor([6.0]))
    monkeypatch.undo()
    assert "operator.mul(" in fxcodegen.generate(gm).code


GETITEM_CASES = [
    (0, "int"),
    (-1, "negative int"),
    (slice(1, None), "slice"),
    ((0, 1), "tuple"),
    ((Ellipsis, 0), "ellipsis tuple"),
    (Ellipsis, "ellipsis"),
    ((slice(None), None), "none index"),
]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("index", [c[0] for c in GETITEM_CASES], ids=[c[1] for c in GETITEM_CASES])
def test_getitem_is_a_subscript(index: Any, surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.getitem, (x, index)))
    gm = raw_gm(g)
    code, _, _ = generate_surface(gm, surface)
    assert "operator.getitem" not in dotted_callees(code)
    assert any(isinstance(n, ast.Subscript) for n in ast.walk(ast.parse(code)))
    t = torch.arange(12.0).reshape(3, 4)
    torch.testing.assert_close(compile_surface(gm, surface)(t), t[index])


@pytest.mark.parametrize("surface", SURFACES)
def test_getitem_str_key_and_literal_receiver(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.getitem, (x, "key with 'quote'"))
    b = g.call_function(operator.getitem, ((5, 6, 7), 1))
    c = g.call_function(operator.getitem, ("abc", -1))
    d = g.call_function(operator.getitem, (x, "\ud800"))
    e = g.call_function(operator.getitem, ("abcd", slice(None, None, -2)))
    g.output((a, b, c, d, e))
    fn = compile_surface(raw_gm(g), surface)
    assert fn({"key with 'quote'": 1, "\ud800": 2}) == (1, 6, "c", 2, "db")


# ----------------------------------------------------------------------------- node kinds


@pytest.mark.parametrize("surface", SURFACES)
def test_placeholder_defaults(surface: str) -> None:
    dev = torch.device("cpu")
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=5)
    z = g.placeholder("z", default_value=dev)
    w = g.placeholder("w", default_value=(1, "a"))
    v = g.placeholder("v", default_value=None)
    g.output(g.call_function(capture, (x, y, z, w, v)))
    fn = compile_surface(raw_gm(g), surface)
    args, _ = fn(1)
    assert same(args[:2], (1, 5)) and args[2] is dev and same(args[3:], ((1, "a"), None))
    args, _ = fn(1, 2, 3, 4, 5)
    assert args == (1, 2, 3, 4, 5)


class Scale(torch.nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, a: torch.Tensor, b: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return (a * self.k, a if b is None else a + b)


def nested_split_gm() -> fx.GraphModule:
    """root -> inlined GM `mid` -> inlined GM `leaf` and opaque `op`; root -> opaque `head`."""
    leaf_g = fx.Graph()
    la = leaf_g.placeholder("a")
    leaf_g.output((leaf_g.call_function(torch.ops.aten.sin.default, (la,)),))
    leaf = raw_gm(leaf_g)

    mid_root = torch.nn.Module()
    mid_root.leaf = leaf
    mid_root.op = Scale(2.0)
    mid_g = fx.Graph()
    ma = mid_g.placeholder("a")
    mb = mid_g.placeholder("b")
    l0 = mid_g.call_module("leaf", (ma,))
    l1 = mid_g.call_function(operator.getitem, (l0, 0))
    o = mid_g.call_module("op", (l1,), {"b": mb})
    o1 = mid_g.call_function(operator.getitem, (o, 1))
    mid_g.output((o1, l1))
    mid = raw_gm(mid_g, mid_root)

    root = torch.nn.Module()
    root.head = Scale(3.0)
    root.mid = mid
    g = fx.Graph()
    x = g.placeholder("x")
    h = g.call_module("head", (x,))
    h0 = g.call_function(operator.getitem, (h, 0))
    m = g.call_module("mid", (h0, x))
    m0 = g.call_function(operator.getitem, (m, 0))
    m_again = g.call_module("mid", (m0,), {"b": h0})
    g.output([m0, {"again": m_again}])
    return raw_gm(g, root)


@pytest.mark.parametrize("surface", ["native"])
def test_call_module_opaque_and_nested_inlined(surface: str) -> None:
    gm = nested_split_gm()
    gen = fxcodegen.generate(gm)
    assert gen.submod_names == ["head", "mid", "mid.leaf", "mid.op"]
    assert "def __fx_f1(" in gen.code and "def __fx_f2(" in gen.code
    assert "__fx_s0(" in gen.code and "__fx_s3(" in gen.code
    assert "def __fx_f0" not in gen.code and "def __fx_f3" not in gen.code
    x = torch.randn(3)
    want = fx.Interpreter(gm).run(x)
    got = fxcodegen.build(gm)(x)
    torch.testing.assert_close(got, want)
    # The compiled function needs callables only for the opaque children.
    fn = fxcodegen.compile_execution_fn(
        gen.code,
        {"head": gm.head, "mid.op": gm.mid.op},
        gen.submod_names,
        gen.consts,
    )
    torch.testing.assert_close(fn(x), want)


class Stamp(torch.nn.Module):
    """An opaque child that leaves its mark: ``x * 10 + k``."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 10 + self.k


@pytest.mark.parametrize("surface", SURFACES)
def test_children_found_in_any_call_order(surface: str) -> None:
    # Children are taken from `_modules` in registration order while the calls follow it;
    # calls out of that order, repeated calls, skipped entries, an entry that is None and a
    # target that is an equal but distinct str must all still reach the right child.
    root = torch.nn.Module()
    for k in range(8):
        root.add_module(f"c{k}", Stamp(k))
    order = ["c0", "c1", "c1", "c3", "c2", "c4", "c0", "c7", "c5", "c6", "c7"]
    g = fx.Graph()
    h = g.placeholder("x")
    for name in order:
        h = g.call_module("".join(list(name)), (h,))
    g.output(h)
    gm = raw_gm(g, root)
    entries = list(gm._modules.items())
    gm._modules.clear()
    for name, child in entries:
        gm._modules[name] = child
        if name == "c1":
            gm._modules["empty"] = None
    x = torch.zeros(1, dtype=torch.float64)
    want = fx.Interpreter(gm).run(x)
    assert int(want.item()) == int("".join(name[1] for name in order))
    torch.testing.assert_close(compile_surface(gm, surface)(x), want)
    _, names, _ = generate_surface(gm, surface)
    assert names == list(dict.fromkeys(order))
    # The None entry is a missing child, whichever way it is looked up: out of order, or as
    # the entry after the last child found.
    for calls in (["empty"], ["c0", "c1", "empty"]):
        g2 = fx.Graph()
        h = g2.placeholder("x")
        for name in calls:
            h = g2.call_module(name, (h,))
        g2.output(h)
        gm.graph = g2
        with pytest.raises(CodegenError, match="empty"):
            generate_surface(gm, surface)


class ShownGraphModule(fx.GraphModule):
    """Shows the graph in `shown` instead of its own, through the `graph` property."""

    shown: fx.Graph

    @property  # type: ignore[override]
    def graph(self) -> fx.Graph:
        return getattr(self, "shown", None) or fx.GraphModule.graph.fget(self)

    @graph.setter
    def graph(self, g: fx.Graph) -> None:
        fx.GraphModule.graph.fset(self, g)


class ReversedGraph(fx.Graph):
    """Lists its nodes with the first two swapped (placeholders, so still a valid order)."""

    @property  # type: ignore[override]
    def nodes(self) -> list[fx.Node]:  # type: ignore[override]
        nodes = list(super().nodes)
        return [nodes[1], nodes[0], *nodes[2:]]


@pytest.mark.parametrize("surface", SURFACES)
def test_graph_and_nodes_read_through_overridden_properties(surface: str) -> None:
    # The core reads fx's own node list directly, but only while `graph` and `nodes` are
    # fx's properties: replaced ones are honoured.
    own, shown = fx.Graph(), fx.Graph()
    own.output(own.placeholder("unused"))
    a, b = shown.placeholder("a"), shown.placeholder("b")
    shown.output(shown.call_function(operator.sub, (a, b)))
    gm = ShownGraphModule(torch.nn.Module(), own)
    gm.shown = shown
    fn = compile_surface(gm, surface)
    assert fn(5, 3) == 2
    g = ReversedGraph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output(g.call_function(operator.sub, (a, b)))
    fn = compile_surface(raw_gm(g), surface)
    assert fn(5, 3) == -2


@pytest.mark.parametrize("surface", SURFACES)
def test_node_list_walked_as_fx_walks_it(surface: str) -> None:
    # The core follows the nodes' `_next` links itself. A node marked erased while still
    # linked (as while fx changes a graph) is skipped, as fx's own iteration skips it.
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    dropped = g.call_function(operator.add, (a, b))
    g.output(g.call_function(operator.mul, (a, b)))
    gm = raw_gm(g)
    dropped._erased = True
    assert dropped not in list(gm.graph.nodes)
    code = generate_surface(gm, surface)[0]
    assert "add" not in code and "mul" in code
    assert compile_surface(gm, surface)(5, 3) == 15


class ErasesOnLookup:
    """A callable whose `__name__`, read while the graph is read, erases a later node."""

    def __init__(self, graph: fx.Graph, state: dict[str, Any]) -> None:
        self.graph, self.state = graph, state

    def __call__(self, x: Any) -> Any:
        return x + 1

    @property
    def __name__(self) -> str:  # type: ignore[override]
        victim = self.state.pop("victim", None)
        if victim is not None:
            self.graph.erase_node(victim)
            gc.collect()
        return "erases"


def test_node_list_changed_while_read() -> None:
    # Python code that runs while the graph is read (here a target's attributes) may change
    # the node list: the walk goes on from the current node's link, as fx's iterator does,
    # and never touches the node erased and freed.
    g = fx.Graph()
    a = g.placeholder("a")
    state: dict[str, Any] = {}
    first = g.call_function(ErasesOnLookup(g, state), (a,))
    state["victim"] = g.call_function(operator.neg, (a,))
    g.output(g.call_function(operator.add, (first, a)))
    gen = fxcodegen.generate(raw_gm(g))
    assert not state, "the target was looked up"
    assert "neg" not in gen.code and "operator.add" in gen.code
    fn = fxcodegen.compile_execution_fn(gen.code, {}, gen.submod_names, gen.consts)
    assert fn(1) == 3


BROKEN_LINK = """
import operator, sys, fxcodegen
from torch import fx
g = fx.Graph()
a = g.placeholder("a")
node = g.call_function(operator.neg, (a,))
g.output(node)
gm = fx.GraphModule({}, g)
node._next = "not a node" if sys.argv[1] == "str" else node
try:
    fxcodegen.generate(gm)
except fxcodegen.CodegenError as e:
    print("CodegenError:", e)
"""


@pytest.mark.parametrize("link", ["str", "cycle"])
def test_a_broken_node_link_is_a_clear_error(link: str) -> None:
    # fx's own iterator would read a str as a node, or follow a cycle that misses the root
    # forever; the core's walk checks every link and stops. In a fresh process, so that a
    # crash fails this test only.
    run = fresh_python(BROKEN_LINK, {}, link)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "CodegenError:" in run.stdout and "node list is broken" in run.stdout


@pytest.mark.parametrize("surface", SURFACES)
def test_call_method_and_kwargs(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_method("add", (x, x), {"alpha": 2})
    z = g.call_method("sum", (y,), {"dim": 0, "keepdim": True})
    g.output(g.call_method("to", (z,), {"dtype": torch.float64}))
    t = torch.randn(3, 2)
    got = compile_surface(raw_gm(g), surface)(t)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, (t + 2 * t).sum(0, keepdim=True).double())


class WithAttrs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("buf", torch.arange(3.0))
        self.const = torch.tensor([5.0, 6.0, 7.0])
        self.sub = torch.nn.Module()
        self.sub.deep = torch.nn.Parameter(torch.ones(3))


@pytest.mark.parametrize("surface", SURFACES)
def test_get_attr_goes_to_pool_by_identity(surface: str) -> None:
    root = WithAttrs()
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("weight")
    b = g.get_attr("buf")
    c = g.get_attr("const")
    d = g.get_attr("sub.deep")
    w2 = g.get_attr("weight")
    s = g.call_function(torch.ops.aten.add.Tensor, (x, w))
    g.output((s, w, b, c, d, w2))
    gm = fx.GraphModule(root, g)
    code, _, consts = generate_surface(gm, surface)
    assert len(consts) == 4  # weight once, buf, const, sub.deep (aten.add is named)
    out = compile_surface(gm, surface)(torch.zeros(3))
    assert out[1] is gm.weight and out[5] is gm.weight
    assert out[2] is gm.buf and out[3] is gm.const and out[4] is gm.sub.deep
    torch.testing.assert_close(out[0], gm.weight.detach())


@pytest.mark.parametrize("surface", SURFACES)
def test_output_nesting_and_placeholder_returned(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    n = g.call_function(operator.add, (x, 1))
    g.output([x, (n,), {"a": [None, (y, {"b": n})]}, None, ()])
    fn = compile_surface(raw_gm(g), surface)
    sentinel = object()
    out = fn(1, sentinel)
    assert type(out) is list and len(out) == 5 and out[0] == 1 and out[1] == (2,)
    assert out[2]["a"][0] is None and out[2]["a"][1][0] is sentinel
    assert out[2]["a"][1][1] == {"b": 2} and out[3] is None and out[4] == ()

    g = fx.Graph()
    x = g.placeholder("x")
    g.output(x)
    fn = compile_surface(raw_gm(g), surface)
    assert fn(sentinel) is sentinel

    g = fx.Graph()
    g.placeholder("x")
    g.output(None)
    assert compile_surface(raw_gm(g), surface)(1) is None


@pytest.mark.parametrize("surface", SURFACES)
def test_zero_input_graph(surface: str) -> None:
    g = fx.Graph()
    t = g.call_function(torch.ones, (2,), {"dtype": torch.float64})
    g.output((t, 3))
    fn = compile_surface(raw_gm(g), surface)
    out = fn()
    assert out[1] == 3 and out[0].dtype == torch.float64
    torch.testing.assert_close(out[0], torch.ones(2, dtype=torch.float64))


# ----------------------------------------------------------------------------- names

RESERVED_NAMES = [
    "torch",
    "operator",
    "len",
    "float",
    "print",
    "__fx_c0",
    "__fx_s0",
    "__fx_f0",
    "__vllm_submods__",
    "__vllm_consts__",
    "__vllm_inlined_submods__0",
    "execution_fn",
    "__builtins__",
    "__debug__",
    "lambda",
    "match",
    "None",
    "x",
]


@pytest.mark.parametrize("surface", SURFACES)
def test_placeholders_named_like_what_the_code_needs(surface: str) -> None:
    """Placeholders may be called ``torch``, ``len``, ``__fx_c0``, ...: the code still runs."""
    child_g = fx.Graph()
    ca = child_g.placeholder("a")
    cb = child_g.placeholder("b")
    ca.name, cb.name = "torch", "__fx_f0"
    cs = child_g.call_function(torch.ops.aten.add.Tensor, (ca, cb))
    cs.name = "__vllm_inlined_submods__0"
    child_g.output((cs,))
    root = torch.nn.Module()
    root.child = raw_gm(child_g)
    root.opaque = Scale(2.0)

    g = fx.Graph()
    phs = []
    for name in RESERVED_NAMES:
        p = g.placeholder(f"p{len(phs)}")
        p.name = name
        phs.append(p)
    ps = dict(zip(RESERVED_NAMES, phs, strict=True))
    a = g.call_function(torch.ops.aten.add.Tensor, (ps["torch"], ps["operator"]))
    a.name = "operator"  # a duplicate node name as well
    b = g.call_function(operator.mul, (a, ps["len"]))
    c = g.call_function(len, ([ps["float"], ps["print"]],))
    d = g.call_function(capture, (ps["__fx_c0"], float("nan"), torch.device("cpu")))
    e = g.call_module("child", (b, ps["__fx_s0"]))
    e0 = g.call_function(operator.getitem, (e, 0))
    f = g.call_module("opaque", (e0,))
    rest = [ps[n] for n in RESERVED_NAMES[6:]]
    g.output((b, c, d, f, rest))
    gm = raw_gm(g, root)
    code, names, _ = generate_surface(gm, surface)
    compile(code, "<check>", "exec")
    fn = compile_surface(gm, surface)
    vals = [torch.tensor([float(i)]) for i in range(len(RESERVED_NAMES))]
    out = fn(*vals)
    torch.testing.assert_close(out[0], (vals[0] + vals[1]) * vals[2])
    assert out[1] == 2
    assert out[2][0][0] is vals[5] and math.isnan(out[2][0][1])
    torch.testing.assert_close(out[3][0], (out[0] + vals[6]) * 2.0)
    assert all(o is v for o, v in zip(out[4], vals[6:], strict=True))


@pytest.mark.parametrize("surface", SURFACES)
def test_keyword_and_non_identifier_kwargs(surface: str) -> None:
    kwargs = {"lambda": 1, "class": 2, "a b": 3, "1x": 4, "": 5, "é": 6, "ok": 7, "None": 8}
    # to a pooled callable
    gm = call_graph(**kwargs)
    _, got = compile_surface(gm, surface)(None)
    assert got == kwargs
    # Many keys, plain ones and one that is not an identifier after the eighth, in order.
    many = {f"k{i}": i for i in range(11)}
    for extra in ({}, {"not ident": 11}, {"class": 12}):
        kw = {**many, **extra}
        code, _, _ = generate_surface(call_graph(**kw), surface)
        assert ("**{" in code) == bool(extra)
        _, got = compile_surface(call_graph(**kw), surface)(None)
        assert got == kw and list(got) == list(kw)


class KwSink(torch.nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args, kwargs


@pytest.mark.parametrize("surface", SURFACES)
def test_keyword_kwargs_to_opaque_and_inlined_children(surface: str) -> None:
    child_g = fx.Graph()
    ca = child_g.placeholder("lambda")  # target "lambda"; fx names it lambda_1
    cb = child_g.placeholder("a b")
    cc = child_g.placeholder("torch", default_value=10)
    child_g.output((ca, cb, cc))
    assert ca.target == "lambda" and cb.target == "a b"
    root = torch.nn.Module()
    root.inl = raw_gm(child_g)
    root.sink = KwSink()
    g = fx.Graph()
    x = g.placeholder("x")
    s = g.call_module("sink", (x,), {"lambda": 1, "class": x, "a b": 3})
    i = g.call_module("inl", (), {"a b": x, "lambda": 2, "torch": 4})
    j = g.call_module("inl", (x,), {"a b": 5})
    g.output((s, i, j))
    fn = compile_surface(raw_gm(g, root), surface)
    s_out, i_out, j_out = fn("X")
    assert s_out == (("X",), {"lambda": 1, "class": "X", "a b": 3})
    assert i_out == (2, "X", 4)
    assert j_out == ("X", 5, 10)


@pytest.mark.parametrize("surface", SURFACES)
def test_kwarg_key_with_lone_surrogate(surface: str) -> None:
    """A key that is not an identifier (nor even UTF-8) still passes correctly."""
    gm = call_graph(**{"\ud800": 1, "ok": 2})
    _, got = compile_surface(gm, surface)(None)
    assert got == {"\ud800": 1, "ok": 2}


# ----------------------------------------------------------------------------- memory


class Tracker:
    """Opaque callables that make fresh tensors and record which tracked values are alive."""

    def __init__(self) -> None:
        self.refs: dict[str, weakref.ref[torch.Tensor]] = {}
        self.log: list[tuple[str, list[str]]] = []

    def alive(self) -> list[str]:
        gc.collect()
        return sorted(k for k, r in self.refs.items() if r() is not None)

    def maker(self, tag: str) -> Any:
        def make(*args: Any) -> torch.Tensor:
            self.log.append((tag, self.alive()))
            t = torch.zeros(1)
            self.refs[tag] = weakref.ref(t)
            return t

        return make


def memory_gm(tracker: Tracker, inline: bool) -> fx.GraphModule:
    """a=A(x); b=B(x) (unused); c=C(a); d=D(c, x); e=E(d); out (e, c)."""
    root = torch.nn.Module()
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(tracker.maker("a"), (x,))
    g.call_function(tracker.maker("b"), (x,))
    c = g.call_function(tracker.maker("c"), (a,))
    d = g.call_function(tracker.maker("d"), (c, x))
    e = g.call_function(tracker.maker("e"), (d,))
    f = g.call_function(tracker.maker("f"), ())
    g.output((e, c))
    _ = f
    if not inline:
        return raw_gm(g)
    root.inner = raw_gm(g)
    outer = fx.Graph()
    ox = outer.placeholder("x")
    r = outer.call_module("inner", (ox,))
    outer.output(outer.call_function(operator.getitem, (r, 0)))
    return raw_gm(outer, root)


@pytest.mark.parametrize("inline", [False, True], ids=["root", "inlined"])
@pytest.mark.parametrize("surface", SURFACES)
def test_values_released_right_after_last_use(surface: str, inline: bool) -> None:
    tr = Tracker()
    gm = memory_gm(tr, inline)
    fn = compile_surface(gm, surface)
    out = fn(torch.ones(1))
    log = dict(tr.log)
    assert log["a"] == []
    assert log["b"] == ["a"]
    assert log["c"] == ["a"]  # b (never used) is already gone
    assert log["d"] == ["c"]  # a released after C; c is returned, kept
    assert log["e"] == ["c", "d"]
    assert log["f"] == ["c", "e"]  # d released after E; f itself is unused
    if inline:
        assert out is tr.refs["e"]()
    else:
        assert out[0] is tr.refs["e"]() and out[1] is tr.refs["c"]()
    del out
    gc.collect()
    assert tr.alive() == []


def check_del_lines(code: str) -> None:
    """Structurally: in every function, each local is deleted in the statement right after
    its last use (or right after it is made/bound if never used), never before, exactly once,
    and never when it is returned."""
    tree = ast.parse(code)
    for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
        params = [p for p in params if p != "__vllm_submods__"]
        defined: dict[str, int] = {p: -1 for p in params}
        last_use: dict[str, int] = {}
        deleted: dict[str, int] = {}
        returned: set[str] = set()
        for i, stmt in enumerate(fn.body):
            if isinstance(stmt, ast.Delete):
                for t in stmt.targets:
                    assert isinstance(t, ast.Name)
                    assert t.id not in deleted, f"{t.id} deleted twice"
                    deleted[t.id] = i
                continue
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in defined:
                    last_use[n.id] = i
                    if isinstance(stmt, ast.Return):
                        returned.add(n.id)
            if isinstance(stmt, ast.Assign):
                (target,) = stmt.targets
                assert isinstance(target, ast.Name)
                defined[target.id] = i
        for name, at in defined.items():
            if name in returned:
                assert name not in deleted, f"{name} returned but deleted"
                continue
            assert name in deleted, f"{name} never deleted\n{code}"
            anchor = last_use.get(name, at)
            # The del is in the run of del statements right after the anchoring statement.
            d = deleted[name]
            prev = d - 1
            while prev >= 0 and isinstance(fn.body[prev], ast.Delete):
                prev -= 1
            assert prev == anchor, (name, anchor, d, code)


@pytest.mark.parametrize("surface", SURFACES)
def test_del_lines_structure(surface: str) -> None:
    gms = [memory_gm(Tracker(), False), memory_gm(Tracker(), True)]
    if surface == "native":  # vLLM's layout cannot call opaque children from inlined ones
        gms.append(nested_split_gm())
    for gm in gms:
        code, _, _ = generate_surface(gm, surface)
        check_del_lines(code)


# ----------------------------------------------------------------------------- determinism


def node_snapshot(gm: fx.GraphModule) -> list[Any]:
    out = []
    for mod in [gm, *[m for m in gm.modules() if isinstance(m, fx.GraphModule) and m is not gm]]:
        for n in mod.graph.nodes:
            out.append((n.op, n.name, n.target, n.args, dict(n.kwargs), list(n.users)))
    return out


@pytest.mark.parametrize("surface", SURFACES)
def test_deterministic_and_non_mutating(surface: str) -> None:
    gm = fx.symbolic_trace(TracedModel())
    before_code, before_nodes = gm.code, node_snapshot(gm)
    before_children = dict(gm.named_modules())
    r1 = generate_surface(gm, surface)
    r2 = generate_surface(gm, surface)
    assert r1[0] == r2[0] and r1[1] == r2[1]
    assert len(r1[2]) == len(r2[2]) and all(a is b for a, b in zip(r1[2], r2[2], strict=True))
    assert gm.code == before_code and node_snapshot(gm) == before_nodes
    assert dict(gm.named_modules()) == before_children

    gm2 = nested_split_gm()
    snap = node_snapshot(gm2)
    codes = {fxcodegen.generate(gm2).code for _ in range(5)}
    assert len(codes) == 1 and node_snapshot(gm2) == snap
    assert fxcodegen.serialize(gm2) == fxcodegen.serialize(gm2)


def test_concurrent_generate_is_safe() -> None:
    gms = [nested_split_gm(), fx.symbolic_trace(TracedModel()), memory_gm(Tracker(), True)]
    expected = [fxcodegen.generate(gm) for gm in gms]
    results: list[Any] = []

    def work(k: int) -> None:
        for i in range(40):
            gm = gms[(i + k) % len(gms)]
            gen = fxcodegen.generate(gm)
            results.append((gms.index(gm), gen.code, gen.submod_names, gen.consts))

    assert not run_in_threads(8, work)
    assert len(results) == 8 * 40
    for idx, code, names, consts in results:
        exp = expected[idx]
        assert code == exp.code and names == exp.submod_names
        assert len(consts) == len(exp.consts)
        assert all(a is b or a == b for a, b in zip(consts, exp.consts, strict=True))


# ----------------------------------------------------------------------------- tracebacks


@pytest.mark.parametrize("surface", SURFACES)
def test_traceback_shows_generated_line(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(operator.add, (x, 1))
    z = g.call_function(operator.getitem, (y, 99))
    g.output(z)
    gm = raw_gm(g)
    code, _, _ = generate_surface(gm, surface)
    line = next(ln.strip() for ln in code.splitlines() if "[99]" in ln)
    fn = compile_surface(gm, surface)
    with pytest.raises(IndexError):
        try:
            fn(torch.zeros(3))
        except IndexError:
            text = traceback.format_exc()
            assert line in text, text
            raise


@pytest.mark.parametrize("surface", SURFACES)
def test_traceback_through_inlined_child(surface: str) -> None:
    child_g = fx.Graph()
    a = child_g.placeholder("a")
    child_g.output(child_g.call_function(operator.truediv, (a, 0)))
    root = torch.nn.Module()
    root.kid = raw_gm(child_g)
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("kid", (x,)))
    gm = raw_gm(g, root)
    fn = compile_surface(gm, surface)
    with pytest.raises(ZeroDivisionError):
        try:
            fn(1)
        except ZeroDivisionError:
            text = traceback.format_exc()
            assert "operator.truediv(a, 0)" in text, text
            assert "kid = " in text, text
            raise


# ----------------------------------------------------------------------------- errors


def test_codegen_error_is_runtime_error() -> None:
    assert issubclass(CodegenError, RuntimeError)
    assert fxcodegen.CodegenError is fxcodegen.codegen.CodegenError


def node_attrs(err: CodegenError) -> tuple[str | None, str | None, str | None]:
    return err.node, err.op, err.target


@pytest.mark.parametrize("surface", SURFACES)
def test_codegen_error_carries_the_node_op_and_target(surface: str) -> None:
    # Refused while the graph is read: the child does not exist.
    g = fx.Graph()
    x = g.placeholder("x")
    call = g.call_module("no_such_child", (x,))
    call.name = "the_call"
    g.output(call)
    with pytest.raises(CodegenError, match="the_call") as info:
        generate_surface(raw_gm(g), surface)
    assert node_attrs(info.value) == ("the_call", "call_module", "no_such_child")

    # Refused by validation of the node list read: a default that is a node.
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=x)
    g.output(g.call_function(operator.add, (x, y)))
    with pytest.raises(CodegenError, match="default refers to node") as info:
        generate_surface(raw_gm(g, fx_codegen=False), surface)
    assert node_attrs(info.value) == ("y", "placeholder", "y")


def test_codegen_error_about_no_one_node_has_none_attributes() -> None:
    with pytest.raises(CodegenError, match="bad magic") as info:
        fxcodegen.emit(b"not a node list")
    assert node_attrs(info.value) == (None, None, None)
    assert node_attrs(CodegenError("raised in Python")) == (None, None, None)


@pytest.mark.parametrize("surface", SURFACES)
def test_missing_child_names_target(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("no_such_child", (x,)))
    with pytest.raises(CodegenError, match="no_such_child"):
        generate_surface(raw_gm(g), surface)


@pytest.mark.parametrize("surface", SURFACES)
def test_missing_get_attr_names_node(surface: str) -> None:
    g = fx.Graph()
    g.placeholder("x")
    g.output(g.get_attr("not_there"))
    with pytest.raises(CodegenError, match="not_there"):
        generate_surface(raw_gm(g), surface)


@pytest.mark.parametrize("surface", SURFACES)
def test_unsupported_graphs_name_the_node(surface: str) -> None:
    g = fx.Graph()
    g.placeholder("*args")
    g.output(None)
    with pytest.raises(CodegenError, match=r"placeholder.*args|args.*placeholder"):
        generate_surface(raw_gm(g), surface)

    # A node from another graph.
    other = fx.Graph()
    foreign = other.placeholder("foreign_node")
    g = fx.Graph()
    x = g.placeholder("x")
    bad = g.call_function(operator.add, (x, 1))
    bad.name = "bad_add"
    bad.args = (x, foreign)
    g.output(bad)
    with pytest.raises(CodegenError) as info:
        generate_surface(raw_gm(g), surface)
    assert "bad_add" in str(info.value) and "foreign_node" in str(info.value)

    # A node used before it is defined.
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.add, (x, 1))
    b = g.call_function(operator.mul, (a, 2))
    a.args = (b, 1)
    g.output(b)
    with pytest.raises(CodegenError, match="add"):
        generate_surface(raw_gm(g), surface)


@pytest.mark.parametrize("surface", SURFACES)
def test_a_call_of_over_65535_keyword_arguments_names_the_node(surface: str) -> None:
    for n, ok in ((65535, True), (65536, False)):
        g = fx.Graph()
        x = g.placeholder("x")
        call = g.call_function(torch.ops.aten.add.Tensor, (x,), {f"k{i}": i for i in range(n)})
        call.name = "many_keywords"
        g.output(call)
        gm = raw_gm(g, fx_codegen=False)
        if ok:
            code, _, _ = generate_surface(gm, surface)
            assert f"k{n - 1}={n - 1}" in code
        else:
            with pytest.raises(CodegenError, match="more than 65535 keyword") as info:
                generate_surface(gm, surface)
            assert "many_keywords" in str(info.value)


def test_compile_without_opaque_callable_fails_clearly() -> None:
    gm = nested_split_gm()
    gen = fxcodegen.generate(gm)
    with pytest.raises(CodegenError, match="head"):
        fxcodegen.compile_execution_fn(
            gen.code, {"mid.op": gm.mid.op}, gen.submod_names, gen.consts
        )
    with pytest.raises(CodegenError, match="head"):
        fxcodegen.compile_execution_fn(gen.code, {}, gen.submod_names, gen.consts)


def test_compile_without_opaque_callable_of_inlined_child_fails_clearly() -> None:
    gm = nested_split_gm()
    gen = fxcodegen.generate(gm)
    with pytest.raises(CodegenError, match="mid.op"):
        fxcodegen.compile_execution_fn(gen.code, {"head": gm.head}, gen.submod_names, gen.consts)


def test_compile_with_consts_none_loads_pool_free_code() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.aten.add.Tensor, (x, 1.5)))
    gen = fxcodegen.generate(raw_gm(g))
    assert gen.consts == [] and "__fx_c" not in gen.code
    fn = fxcodegen.compile_execution_fn(gen.code, {}, gen.submod_names)
    torch.testing.assert_close(fn(torch.zeros(2)), torch.full((2,), 1.5))
    fn = fxcodegen.compile_execution_fn(gen.code, None, gen.submod_names, None)
    torch.testing.assert_close(fn(torch.zeros(2)), torch.full((2,), 1.5))
    # Hand-written code of the pre-pool era (no imports, no pool) loads too.
    legacy = "def execution_fn(a, b):\n    c = torch.add(a, b)\n    del a, b\n    return c\n"
    fn = fxcodegen.compile_execution_fn(legacy, {}, [], None)
    torch.testing.assert_close(fn(torch.ones(1), torch.ones(1)), torch.full((1,), 2.0))


def test_build_binds_own_children() -> None:
    gm = nested_split_gm()
    x = torch.randn(4)
    torch.testing.assert_close(fxcodegen.build(gm)(x), fx.Interpreter(gm).run(x))


# ------------------------------------------------------------ nodes not read through slots


class _SubNode(fx.Node):
    """A Node subclass: the reader takes its fields through getattr, not member slots."""


def _chain_gm() -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(operator.add, (x, 1), {})
    b = g.call_method("mul", (a, 2.5))
    g.output((b, [a, {"k": x}]))
    return raw_gm(g)


def test_node_subclass_reads_like_a_node() -> None:
    want = fxcodegen.generate(_chain_gm())
    gm = _chain_gm()
    for node in gm.graph.nodes:
        node.__class__ = _SubNode
    got = fxcodegen.generate(gm)
    assert got.code == want.code
    fn = fxcodegen.compile_execution_fn(got.code, {}, got.submod_names, got.consts)
    assert fn(torch.tensor(1.0))[0].item() == 5.0


class _RenamingNode(fx.Node):
    """A Node subclass that overrides a field: its nodes must be read through getattr."""

    @property
    def name(self) -> str:  # type: ignore[override]
        return "renamed_" + fx.Node.name.__get__(self)

    @name.setter
    def name(self, value: str) -> None:
        fx.Node.name.__set__(self, value)


def test_node_subclass_overriding_a_field_is_read_through_it() -> None:
    gm = _chain_gm()
    for node in gm.graph.nodes:
        node.__class__ = _RenamingNode
    code = fxcodegen.generate(gm).code
    assert "renamed_add = " in code and "def execution_fn(renamed_x)" in code


def test_a_field_patched_on_node_is_read_through_the_patch() -> None:
    # Fields are read from their slots only while fx.Node still resolves them to its C
    # members; a pass that starts after a patch reads through it.
    fxcodegen.generate(_chain_gm())
    member = fx.Node.name
    fx.Node.name = property(lambda n: "p_" + member.__get__(n))  # type: ignore[assignment]
    try:
        assert "p_add = " in fxcodegen.generate(_chain_gm()).code
    finally:
        del fx.Node.name
    assert fx.Node.name is member
    assert "p_add" not in fxcodegen.generate(_chain_gm()).code


def test_an_emptied_node_slot_raises_as_getattr_does() -> None:
    gm = _chain_gm()
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    fx.Node.target.__delete__(node)
    with pytest.raises(AttributeError, match="target"):
        fxcodegen.generate(gm)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("_args", [1], "args is not a tuple"),
        ("_kwargs", [("k", 1)], "kwargs is not a dict"),
        ("name", 5, "the name is not a str"),
        ("op", "call_everything", "unknown op"),
    ],
)
def test_malformed_node_fields_name_the_node(field: str, value: Any, message: str) -> None:
    gm = _chain_gm()
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    object.__setattr__(node, field, value)
    with pytest.raises(CodegenError, match=message) as info:
        fxcodegen.generate(gm)
    assert "add" in str(info.value)


# ------------------------------------------------------------------ clear errors on bad input


@pytest.mark.parametrize("surface", SURFACES)
def test_generate_of_a_non_graph_module_is_a_type_error(surface: str) -> None:
    for bad in (42, None, "gm", torch.nn.Linear(1, 1)):
        with pytest.raises(TypeError, match="expected a torch.fx.GraphModule") as info:
            generate_surface(bad, surface)  # type: ignore[arg-type]
        assert type(bad).__name__ in str(info.value)
    with pytest.raises(TypeError, match="expected a torch.fx.GraphModule"):
        fxcodegen.serialize(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a torch.fx.GraphModule"):
        fxcodegen.build(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("surface", SURFACES)
def test_an_int_over_4300_digits_is_pooled(surface: str) -> None:
    huge = 10**5000 + 7
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(operator.add, (x, huge)))
    gm = raw_gm(g, fx_codegen=False)
    code, _, consts = generate_surface(gm, surface)
    assert any(c is huge for c in consts) and "1000000000" not in code
    assert compile_surface(gm, surface)(1) == huge + 1
    # The serialized node list refers to it by pool slot, and emits the same code.
    assert fxcodegen.emit(fxcodegen.serialize(gm))[0] == fxcodegen.generate(gm).code
    # One of 4,300 digits is still written as a literal.
    g = fx.Graph()
    g.output(g.call_function(operator.neg, (10**4299,)))
    code, _, consts = generate_surface(raw_gm(g, fx_codegen=False), surface)
    assert "1" + "0" * 4299 in code and consts == []


@pytest.mark.parametrize("surface", SURFACES)
def test_a_string_call_target_is_a_clear_error(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    call = g.call_function(torch.add, (x, x))
    call.name = "by_name"
    call.target = "torch.add"  # fx checks the target only when the node is made
    g.output(call)
    gm = raw_gm(g, fx_codegen=False)
    with pytest.raises(CodegenError, match='target is the str "torch.add"') as info:
        generate_surface(gm, surface)
    assert "by_name" in str(info.value)
    with pytest.raises(CodegenError, match="not a callable"):
        fxcodegen.serialize(gm)


@pytest.mark.parametrize("surface", SURFACES)
def test_a_placeholder_default_that_is_a_node_is_a_clear_error(surface: str) -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=x)
    g.output(g.call_function(operator.add, (x, y)))
    gm = raw_gm(g, fx_codegen=False)
    with pytest.raises(CodegenError, match='default refers to node "x"') as info:
        generate_surface(gm, surface)
    assert '"y"' in str(info.value)
    with pytest.raises(CodegenError, match="default refers to node"):
        fxcodegen.serialize(gm)
    with pytest.raises(CodegenError, match="default refers to node"):
        fxcodegen.build(gm)


@pytest.mark.parametrize("surface", SURFACES)
def test_one_child_called_under_several_names_is_defined_once(surface: str) -> None:
    child = fx.GraphModule(torch.nn.Module(), _neg_graph())
    root = torch.nn.Module()
    for name in ("a", "b", "c"):
        root.add_module(name, child)
    g = fx.Graph()
    h = g.placeholder("x")
    for name in ("a", "b", "c", "a"):
        h = g.call_module(name, (h,))
    g.output(h)
    gm = fx.GraphModule(root, g)
    code, names, _ = generate_surface(gm, surface)
    assert names == ["a", "b", "c"]
    assert code.count("def __") == 1, code
    assert compile_surface(gm, surface)(torch.tensor(2.0)).item() == 2.0


def _neg_graph() -> fx.Graph:
    g = fx.Graph()
    g.output(g.call_function(operator.neg, (g.placeholder("x"),)))
    return g
