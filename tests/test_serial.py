"""The serialized node list (``fxcodegen.serialize`` / ``fxcodegen.emit``).

Round trips must give ``generate``'s code; ``emit``'s input is untrusted: whatever the bytes,
the result is ``CodegenError`` or code whose AST holds nothing but the expected shapes (imports
of torch/operator, function defs, assignments of expressions, ``del`` of names, ``return``).
"""

from __future__ import annotations

import ast
import operator
import random
import struct
import warnings

import fxcodegen
import pytest
import torch
from conftest import raw_gm
from fxcodegen import CodegenError
from torch import fx

# ----------------------------------------------------------------------------- an encoder
# Independent of the core: written from the format in rust/serial.rs's module docs.


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return varint(len(raw)) + raw


def zigzag(v: int) -> bytes:
    return varint((v << 1) ^ (v >> 63) if v < 0 else v << 1)


class A:
    """Argument encoders."""

    @staticmethod
    def node(i: int) -> bytes:
        return b"\x00" + varint(i)

    none = b"\x01"
    false = b"\x02"
    true = b"\x03"

    @staticmethod
    def int(v: int) -> bytes:
        return b"\x04" + zigzag(v)

    @staticmethod
    def bigint(text: str) -> bytes:
        return b"\x05" + s(text)

    @staticmethod
    def float(v: float) -> bytes:
        return b"\x06" + struct.pack("<d", v)

    @staticmethod
    def str(text: str) -> bytes:
        return b"\x07" + s(text)

    @staticmethod
    def bytes(b: bytes) -> bytes:
        return b"\x08" + s(b)

    @staticmethod
    def const(k: int) -> bytes:
        return b"\x09" + varint(k)

    @staticmethod
    def tuple(*items: bytes) -> bytes:
        return b"\x0a" + varint(len(items)) + b"".join(items)

    @staticmethod
    def list(*items: bytes) -> bytes:
        return b"\x0b" + varint(len(items)) + b"".join(items)

    @staticmethod
    def dict(*pairs: tuple[bytes, bytes]) -> bytes:
        return b"\x0c" + varint(len(pairs)) + b"".join(k + v for k, v in pairs)


def node(
    op: int,
    name: str,
    target: bytes,
    args: list[bytes] = (),  # type: ignore[assignment]
    kwargs: list[tuple[str, bytes]] = (),  # type: ignore[assignment]
) -> bytes:
    out = bytes([op]) + s(name) + target + varint(len(args)) + b"".join(args)
    out += varint(len(kwargs)) + b"".join(A.str(k) + v for k, v in kwargs)
    return out


def placeholder(name: str, target: str | None = None, default: bytes | None = None) -> bytes:
    return node(0, name, s(target or name), [default] if default is not None else [])


def call_name(name: str, fn: str, args: list[bytes], kwargs: list[tuple[str, bytes]] = ()) -> bytes:  # type: ignore[assignment]
    return node(2, name, b"\x00" + s(fn), args, kwargs)


def call_getitem(name: str, args: list[bytes]) -> bytes:
    return node(2, name, b"\x01", args)


def call_const(name: str, k: int, args: list[bytes]) -> bytes:
    return node(2, name, b"\x02" + varint(k), args)


def call_module(
    name: str, i: int, args: list[bytes], kwargs: list[tuple[str, bytes]] = ()
) -> bytes:  # type: ignore[assignment]
    return node(1, name, varint(i), args, kwargs)


def call_method(name: str, method: str, args: list[bytes]) -> bytes:
    return node(3, name, s(method), args)


def get_attr(name: str, k: int) -> bytes:
    return node(4, name, varint(k))


def output(arg: bytes | None) -> bytes:
    return node(5, "output", b"", [arg] if arg is not None else [])


def program(
    graphs: list[list[bytes]],
    submods: list[tuple[str, int | None]] = (),  # type: ignore[assignment]
    n_consts: int = 0,
    version: int = 1,
) -> bytes:
    out = b"FXCG" + bytes([version]) + varint(n_consts) + varint(len(submods))
    for name, g in submods:
        out += s(name) + (b"\x00" if g is None else b"\x01" + varint(g))
    out += varint(len(graphs))
    for nodes in graphs:
        out += varint(len(nodes)) + b"".join(nodes)
    return out


SMALL = program(
    [
        [
            placeholder("x"),
            placeholder("y", default=A.int(-3)),
            call_name("add", "operator.add", [A.node(0), A.node(1)]),
            call_module("sub", 0, [A.node(2)], [("k", A.str("v"))]),
            call_getitem("gi", [A.node(3), A.int(0)]),
            call_method("m", "view", [A.node(4), A.tuple(A.int(-1))]),
            call_const("c", 0, [A.node(5), A.float(-0.0)]),
            output(A.tuple(A.node(6), A.list(A.none, A.true))),
        ],
        [placeholder("a"), output(A.node(0))],
    ],
    submods=[("sub", 1)],
    n_consts=1,
)

# ----------------------------------------------------------------------------- AST safety

ALLOWED_EXPR = (
    ast.Call,
    ast.Name,
    ast.Attribute,
    ast.Subscript,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.Dict,
    ast.UnaryOp,
    ast.USub,
    ast.keyword,
    ast.Load,
    ast.Store,
    ast.Del,
)


def check_safe(code: str) -> None:
    """Only: ``import torch``/``import operator``, then function defs whose bodies are
    ``name = expr``, ``del names`` and ``return expr``; expressions are calls, names,
    attribute chains, subscripts, constants and container displays."""
    tree = ast.parse(code)
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            assert [a.name for a in stmt.names] in (["torch"], ["operator"]), code
            assert all(a.asname is None for a in stmt.names)
            continue
        assert isinstance(stmt, ast.FunctionDef), code
        assert not stmt.decorator_list and stmt.returns is None
        assert stmt.args.vararg is None and stmt.args.kwarg is None
        for default in stmt.args.defaults + [d for d in stmt.args.kw_defaults if d]:
            check_expr(default, code)
        for inner in stmt.body:
            if isinstance(inner, ast.Assign):
                assert len(inner.targets) == 1 and isinstance(inner.targets[0], ast.Name), code
                check_expr(inner.value, code)
            elif isinstance(inner, ast.Delete):
                assert all(isinstance(t, ast.Name) for t in inner.targets), code
            elif isinstance(inner, ast.Return):
                if inner.value is not None:
                    check_expr(inner.value, code)
            else:
                raise AssertionError(f"unexpected statement {ast.dump(inner)}\n{code}")


def check_expr(expr: ast.AST, code: str) -> None:
    for n in ast.walk(expr):
        assert isinstance(n, ALLOWED_EXPR), f"unexpected {type(n).__name__} in\n{code}"


def try_emit(data: bytes) -> tuple[str, list[str]] | None:
    """``emit(data)``: CodegenError → None; anything else but success fails the test."""
    try:
        code, names = fxcodegen.emit(data)
    except CodegenError:
        return None
    assert isinstance(code, str) and isinstance(names, list)
    check_safe(code)
    with warnings.catch_warnings():
        # e.g. ``True[0]`` from a mutated receiver: valid code, a SyntaxWarning at compile time.
        warnings.simplefilter("ignore", SyntaxWarning)
        compile(code, "<emitted>", "exec")
    return code, names


# ----------------------------------------------------------------------------- round trips


def sample_gms() -> list[fx.GraphModule]:
    from test_codegen_semantics import TracedModel, Tracker, memory_gm, nested_split_gm

    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=(1, "two", b"3", 4.5, None, True, 2**70, -math_inf()))
    a = g.call_function(operator.getitem, (x, (Ellipsis, slice(1))))
    b = g.call_method("add", (a, y), {"alpha": 2})
    c = g.call_function(torch.ops.aten.mul.Tensor, (b, torch.tensor(2.0)))
    g.output({"c": [c, None], "d": (torch.device("cpu"),)})
    gm = raw_gm(g)
    return [
        gm,
        nested_split_gm(),
        fx.symbolic_trace(TracedModel()),
        memory_gm(Tracker(), True),
        memory_gm(Tracker(), False),
    ]


def math_inf() -> float:
    return float("inf")


def test_round_trip_gives_generate_code() -> None:
    for gm in sample_gms():
        data = fxcodegen.serialize(gm)
        assert isinstance(data, bytes) and data[:5] == b"FXCG\x01"
        gen = fxcodegen.generate(gm)
        code, names = fxcodegen.emit(data)
        assert code == gen.code
        assert names == gen.submod_names
        check_safe(code)


@pytest.mark.parametrize("shape", ["stitch", "inline"])
def test_round_trip_of_large_graphs_gives_generate_code(shape: str) -> None:
    # Large enough that `emit` writes on two threads, whose pieces go straight into its str,
    # while `generate` takes other paths (a stitching root written as it is read; an inlined
    # child of 10k nodes on one thread).
    from fxcodegen.bench import workloads

    gm = workloads.SHAPES[shape](10_000).gm
    gen = fxcodegen.generate(gm)
    code, names = fxcodegen.emit(fxcodegen.serialize(gm))
    assert len(code) > 300_000
    assert code == gen.code
    assert names == gen.submod_names


def test_small_input_is_valid_and_matches_encoder() -> None:
    out = try_emit(SMALL)
    assert out is not None
    code, names = out
    assert names == ["sub"]
    assert "operator.add(x, y)" in code and "def __fx_f0(a):" in code
    assert "__fx_c0(m, -0.0)" in code and "view((-1,))" in code
    assert "def execution_fn(x, y=-3):" in code


# ----------------------------------------------------------------------------- untrusted input


def test_truncated_at_every_offset() -> None:
    datas = [SMALL] + [fxcodegen.serialize(gm) for gm in sample_gms()]
    for data in datas:
        for n in range(len(data)):
            with pytest.raises(CodegenError):
                fxcodegen.emit(data[:n])
        # trailing garbage
        with pytest.raises(CodegenError):
            fxcodegen.emit(data + b"\x00")


def test_every_single_byte_mutation() -> None:
    accepted = 0
    for pos in range(len(SMALL)):
        for value in range(256):
            if value == SMALL[pos]:
                continue
            data = SMALL[:pos] + bytes([value]) + SMALL[pos + 1 :]
            accepted += try_emit(data) is not None
    # Some mutations (e.g. changed letters of names or literal values) are still valid input.
    assert accepted > 0


def test_random_mutations_of_real_graphs() -> None:
    datas = [fxcodegen.serialize(gm) for gm in sample_gms()]
    rng = random.Random(7)
    for i in range(3000):
        data = bytearray(datas[i % len(datas)])
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            pos = rng.randrange(len(data))
            if kind < 0.5:
                data[pos] = rng.randrange(256)
            elif kind < 0.75:
                del data[pos]
            else:
                data.insert(pos, rng.randrange(256))
        try_emit(bytes(data))


def test_random_bytes() -> None:
    for seed in range(4000):
        rng = random.Random(seed)
        n = rng.randint(0, 64)
        body = bytes(rng.randrange(256) for _ in range(n))
        try_emit(body)
        try_emit(b"FXCG\x01" + body)


def test_header_errors() -> None:
    for data in [b"", b"FXC", b"FXCG", b"XXXX\x01\x00\x00\x01\x00", program([[]], version=2)]:
        with pytest.raises(CodegenError):
            fxcodegen.emit(data)
    with pytest.raises(CodegenError, match="version"):
        fxcodegen.emit(program([[output(None)]], version=2))
    with pytest.raises(CodegenError):
        fxcodegen.emit(program([]))  # no graphs


def test_empty_root_is_valid() -> None:
    code, names = fxcodegen.emit(program([[]]))
    assert names == []
    ns: dict = {}
    exec(compile(code, "<e>", "exec"), ns)
    assert ns["execution_fn"]() is None


BAD_PROGRAMS = {
    "unknown op code": program([[bytes([6]) + s("n") + b"\x00" * 8]]),
    "unknown op code 255": program([[bytes([255]) + s("n") + b"\x00" * 8]]),
    "unknown arg tag": program([[placeholder("x"), output(b"\x0d")]]),
    "unknown call target tag": program([[node(2, "f", b"\x03")]]),
    "unknown submodule kind": b"FXCG\x01\x00\x01" + s("sub") + b"\x02" + b"\x01\x00",
    "dangling node ref": program([[placeholder("x"), output(A.node(1))]]),
    "forward node ref": program(
        [[placeholder("x"), call_name("a", "operator.neg", [A.node(2)]), output(A.node(1))]]
    ),
    "ref to output": program([[output(None), output(A.node(0))]]),
    "output not last": program([[output(None), placeholder("x")]]),
    "self ref": program([[call_name("a", "operator.neg", [A.node(0)])]]),
    "const out of pool": program([[call_const("c", 0, [])]], n_consts=0),
    "const arg out of pool": program([[output(A.const(3))]], n_consts=3),
    "get_attr out of pool": program([[get_attr("w", 1)]], n_consts=1),
    "submodule out of range": program([[call_module("m", 0, [])]]),
    "inline graph missing": program([[output(None)]], submods=[("s", 5)]),
    "inline graph is root": program([[call_module("m", 0, [])]], submods=[("s", 0)]),
    "inline cycle": program(
        [[call_module("m", 0, [])], [call_module("m", 0, [])]], submods=[("s", 1)]
    ),
    "call name with code": program([[call_name("f", "x); import os; (", [])]]),
    "call name not rooted": program([[call_name("f", "os.system", [A.str("echo")])]]),
    "call name eval": program([[call_name("f", "eval", [A.str("1")])]]),
    "call name exec": program([[call_name("f", "exec", [A.str("1")])]]),
    "call name __import__": program([[call_name("f", "__import__", [A.str("os")])]]),
    "call name empty part": program([[call_name("f", "torch..add", [])]]),
    "call name keyword part": program([[call_name("f", "torch.lambda", [])]]),
    "call name newline": program([[call_name("f", "torch.add\nimport os", [])]]),
    "call name space": program([[call_name("f", "torch.add ", [])]]),
    "method with code": program(
        [[placeholder("x"), call_method("m", "add(1); import os; x.add", [A.node(0)])]]
    ),
    "method keyword": program([[placeholder("x"), call_method("m", "class", [A.node(0)])]]),
    "method no receiver": program([[call_method("m", "add", [])]]),
    "variadic placeholder": program([[placeholder("args", target="*args")]]),
    "placeholder two defaults": program([[node(0, "x", s("x"), [A.int(1), A.int(2)])]]),
    "default then required": program([[placeholder("x", default=A.int(1)), placeholder("y")]]),
    "get_attr with args": program([[node(4, "w", varint(0), [A.int(1)])]], n_consts=1),
    "output two args": program([[node(5, "output", b"", [A.none, A.none])]]),
    "malformed bigint": program([[output(A.bigint("12a"))]]),
    "bigint with code": program([[output(A.bigint("1); import os; (1"))]]),
    "empty bigint": program([[output(A.bigint(""))]]),
    "bigint minus only": program([[output(A.bigint("-"))]]),
    "non utf8 name": program([[node(0, "x", s(b"\xff"))]]),
    "non utf8 str": program([[output(b"\x07" + s(b"\xc3\x28"))]]),
    "non utf8 kw key": program(
        [
            [
                placeholder("x"),
                node(2, "f", b"\x00" + s("len"), [A.node(0)], [])[:-1] + b"\x01\x07\x01\xff\x01",
            ]
        ]
    ),
    "oversized node count": b"FXCG\x01\x00\x00\x01" + varint(2**40),
    "oversized submod count": b"FXCG\x01\x00" + varint(2**62) + b"\x01\x00",
    "oversized string": program([[placeholder("x")]])[:-4] + varint(2**50),
    "oversized tuple": program([[output(b"\x0a" + varint(2**33))]]),
    "oversized dict": program([[output(b"\x0c" + varint(2**63))]]),
    "varint overflow": b"FXCG\x01" + b"\xff" * 10 + b"\x01",
    "varint too long": b"FXCG\x01" + b"\x80" * 11 + b"\x00",
    "n_consts beyond u32": b"FXCG\x01" + varint(2**33) + b"\x00\x01\x00",
    "deep nesting": program([[output(b"\x0a\x01" * 200 + A.none)]]),
    "truncated float": program([[output(b"\x06\x00\x00")]])[:-1],
    "kw to getitem only key": program([[call_getitem("g", [A.int(1)])]]),
}


EXPECTED_REASON = {
    "unknown op code": "unknown op code",
    "unknown arg tag": "unknown argument tag",
    "dangling node ref": "node index",
    "oversized": "exceeds the data left",
    "call name": "call target",
    "variadic": "variadic",
    "deep nesting": "nest",
}


def _with_kwargs(n: int) -> bytes:
    return program([[call_name("f", "operator.add", [], [(f"k{i}", A.none) for i in range(n)])]])


def test_a_node_takes_at_most_65535_keyword_arguments() -> None:
    code, _ = fxcodegen.emit(_with_kwargs(65535))
    assert "k65534=None" in code
    with pytest.raises(CodegenError, match="more than 65535 keyword arguments"):
        fxcodegen.emit(_with_kwargs(65536))


@pytest.mark.parametrize("name", sorted(BAD_PROGRAMS))
def test_bad_programs_raise_codegen_error(name: str) -> None:
    data = BAD_PROGRAMS[name]
    try:
        out = fxcodegen.emit(data)
    except CodegenError as e:
        assert str(e)  # a reason is given
        for key, text in EXPECTED_REASON.items():
            if name.startswith(key):
                assert text in str(e), (name, str(e))
        return
    # A few of these are legitimately accepted (e.g. getitem with one arg falls back to a call):
    # then the code must be safe and free of the injected text.
    code, _ = out
    check_safe(code)
    assert "import os" not in code
    assert name in {"kw to getitem only key"}, f"{name} accepted:\n{code}"


def test_node_errors_name_the_node() -> None:
    data = program([[placeholder("x"), call_name("my_bad_node", "eval", [A.node(0)])]])
    with pytest.raises(CodegenError, match="my_bad_node"):
        fxcodegen.emit(data)


INJECTION_NAMES = [
    "x); import os; (",
    "x\nimport os",
    "x = 1\nimport os\ny",
    "__import__('os').system('echo')",
    "a; del b",
    "lambda: 0",
    "class",
    "__fx_c0",
    "__fx_s0",
    "execution_fn",
    "torch",
    "operator",
    "é",
    "",
    "1abc",
    "a.b",
    "'quoted'",
    "\x00",
]


@pytest.mark.parametrize("bad", INJECTION_NAMES, ids=repr)
def test_names_carrying_code_never_inject(bad: str) -> None:
    """Node names, placeholder targets, submodule names and kwargs keys carrying code are
    either rejected or rendered harmless (renamed identifiers / string literals)."""
    data = program(
        [
            [
                placeholder(bad, target=bad),
                placeholder("y", target=bad + "_t", default=A.str(bad)),
                call_name(bad, "operator.add", [A.node(0), A.node(1)], [(bad, A.str(bad))]),
                call_module(bad + "2", 0, [A.node(2)], [(bad, A.node(1))]),
                call_method("m", "add", [A.node(3), A.dict((A.str(bad), A.bytes(bad.encode())))]),
                output(A.list(A.node(4), A.str(bad))),
            ],
            [placeholder(bad, target=bad), output(A.node(0))],
        ],
        submods=[(bad, 1)],
    )
    out = try_emit(data)
    assert out is not None, "valid structure with odd names must still be accepted"
    code, names = out
    assert names == [bad]
    tree = ast.parse(code)
    assert not any(
        isinstance(n, (ast.Import, ast.ImportFrom)) and n.names[0].name == "os"
        for n in ast.walk(tree)
    )
    # The odd strings survive only as string/bytes constants.
    consts = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert bad in consts and bad.encode() in consts
    # The emitted function runs: bad == kwarg key reaches the inlined child only if it names
    # its parameter; here it does not, so calling it must raise TypeError, not do anything else.
    ns: dict = {"torch": torch, "operator": operator}
    exec(compile(code, "<e>", "exec"), ns)
    fn_args = [
        a.arg
        for a in next(
            f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "execution_fn"
        ).args.args
    ]
    assert len(fn_args) == 2 and all(a.isidentifier() for a in fn_args)


# ----------------------------------------------------------------------------- emit findings
# What an adversarial probe found: inputs `emit` accepted whose source was quadratic in size or
# did not compile. Every input `emit` accepts must produce source that `compile()` accepts.


def test_a_graph_inlined_by_many_submodules_is_defined_once() -> None:
    # 300 submodules inline one 300-node graph: one definition, source linear in the input.
    chain = [placeholder("x")]
    chain += [call_name(f"n{k}", "operator.neg", [A.node(k)]) for k in range(300)]
    chain.append(output(A.node(300)))
    root = [placeholder("x")]
    root += [call_module(f"c{k}", k, [A.node(k)]) for k in range(300)]
    root.append(output(A.node(300)))
    data = program([root, chain], submods=[(f"s{k}", 1) for k in range(300)])
    code, names = fxcodegen.emit(data)
    assert len(names) == 300
    assert code.count("def __fx_f") == 1 and code.count(" = __fx_f0(") == 300
    assert len(code) < 4 * len(data)
    compile(code, "<emitted>", "exec")


def test_source_far_larger_than_the_input_is_refused() -> None:
    # A 4,000-byte name used 100,000 times: 400 MB of source from 400 KB of input.
    data = program([[placeholder("x" * 4000), output(A.tuple(*[A.node(0)] * 100_000))]])
    with pytest.raises(CodegenError, match="more than the .* allowed"):
        fxcodegen.emit(data)


@pytest.mark.parametrize(
    "text", ["-007", "007", "00", "1" * 4301, "-" + "9" * 4301, "", "-", "12a", "+1"]
)
def test_int_text_python_would_not_read_back_is_refused(text: str) -> None:
    data = program([[output(A.bigint(text))]])
    with pytest.raises(CodegenError, match="malformed integer text"):
        fxcodegen.emit(data)


@pytest.mark.parametrize("text", ["0", "-0", "7", "-12345678901234567890123", "9" * 4300])
def test_int_text_python_reads_back_is_accepted(text: str) -> None:
    code, _ = fxcodegen.emit(program([[output(A.bigint(text))]]))
    namespace: dict = {}
    exec(compile(code, "<emitted>", "exec"), namespace)
    assert namespace["execution_fn"]() == int(text)


def test_a_keyword_given_twice_is_refused() -> None:
    call = call_name("twice", "operator.add", [], [("k", A.int(1)), ("k", A.int(2))])
    with pytest.raises(CodegenError, match="'k'.*given twice|\"k\".*given twice") as info:
        fxcodegen.emit(program([[call]]))
    assert "twice" in str(info.value)
    # Also when the keys need the `**{...}` form.
    call = call_name("twice", "operator.add", [], [("a b", A.int(1)), ("a b", A.int(2))])
    with pytest.raises(CodegenError, match="given twice"):
        fxcodegen.emit(program([[call]]))


def test_a_refused_node_is_named_by_the_error_attributes() -> None:
    call = call_name("twice", "operator.add", [], [("k", A.int(1)), ("k", A.int(2))])
    with pytest.raises(CodegenError, match="given twice") as info:
        fxcodegen.emit(program([[call]]))
    err = info.value
    assert (err.node, err.op, err.target) == ("twice", "call_function", "operator.add")
    with pytest.raises(CodegenError, match="version") as info:
        fxcodegen.emit(program([[]], version=2))
    err = info.value
    assert (err.node, err.op, err.target) == (None, None, None)


def test_a_placeholder_default_that_is_a_node_is_refused() -> None:
    data = program([[placeholder("x"), placeholder("y", default=A.node(0)), output(A.node(1))]])
    with pytest.raises(CodegenError, match='refers to node "x"') as info:
        fxcodegen.emit(data)
    assert '"y"' in str(info.value)
    nested = A.tuple(A.int(1), A.list(A.node(0)))
    data = program([[placeholder("x"), placeholder("y", default=nested), output(A.node(1))]])
    with pytest.raises(CodegenError, match="refers to node"):
        fxcodegen.emit(data)
