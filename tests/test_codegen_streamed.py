"""A large root's statements are written on a helper thread while the graph is read, batch by
batch, and assembled into the source once names and last uses are known. That code must equal,
byte for byte, what the emitter writes from the whole node list (``emit(serialize(gm))`` never
writes while reading), and must fail the same way on graphs it cannot handle.
"""

from __future__ import annotations

import operator
from pathlib import Path

import fxcodegen
import pytest
import torch
from conftest import fresh_python, raw_gm, run_in_threads
from torch import fx

# Two threads write while reading from this many nodes on (the helper's threshold).
LARGE = 4_096


class Pair(torch.nn.Module):
    """An opaque child returning two values, whatever keywords it is given."""

    def forward(self, x: torch.Tensor, *rest: object, **kw: object) -> tuple[torch.Tensor, ...]:
        return x + 1, x * 2


def mixed_gm(layers: int = 1500) -> fx.GraphModule:
    """A root of every kind of node and argument: opaque calls with literal, pooled and nested
    keyword arguments (identifier keys and not), getitems that fuse with their call and ones
    that cannot, method calls, attributes, dotted calls, a default parameter, a name to
    rename, and a nested output."""
    root = torch.nn.Module()
    for k in range(5):
        root.add_module(f"m{k}", Pair())
    root.register_buffer("w", torch.ones(3))
    g = fx.Graph()
    x = g.placeholder("x")
    s = g.placeholder("s", default_value=3)
    prev = x
    literals = [0.5, 1e-3, float("inf"), -0.0, 2**70, -7, "é\n'\"", b"\x00\xff", None, True]
    for k in range(layers):
        kwargs = {
            "scale": literals[k % len(literals)],
            "sizes": [s, 16, (1, 2.5)],
            "dt": torch.float16 if k % 2 else torch.bfloat16,
            "dev": torch.device("cpu"),
            "d": {"a": prev, 1: x},
        }
        if k % 9 == 0:  # a key that is no identifier (passed through `**{...}`)
            kwargs["not an identifier"] = k
        call = g.call_module(f"m{k % 5}", (prev, x, s), kwargs)
        first = g.call_function(operator.getitem, (call, 0))
        if k % 4 == 0:  # used twice: no fusing
            second = g.call_function(operator.getitem, (call, 1))
            first = g.call_function(torch.add, (first, second))
        elif k % 4 == 1:  # an item of an item: the first getitem fuses with the second
            inner = g.call_function(operator.getitem, (first, 0))
            second = g.call_function(operator.getitem, (call, 1))
            first = g.call_function(torch.add, (inner, second))
        if k % 7 == 0:
            first = g.call_method("mul", (first, 2.0))
        if k % 11 == 0:
            first = g.call_function(operator.add, (first, g.get_attr("w")))
        if k == layers // 2:
            first.name = "é"  # renamed (identifiers are written in ASCII)
        prev = first
    g.output((prev, [x, s]))
    return raw_gm(g, root)


def chain_gm(n: int) -> fx.GraphModule:
    """``x`` then ``n - 2`` adds then the output: ``n`` nodes."""
    g = fx.Graph()
    prev = x = g.placeholder("x")
    for k in range(n - 2):
        prev = g.call_function(operator.add, (prev, x if k % 3 else 1))
    g.output(prev)
    return fx.GraphModule(torch.nn.Module(), g)


def whole_list_code(gm: fx.GraphModule) -> str:
    return fxcodegen.emit(fxcodegen.serialize(gm))[0]


def test_mixed_root_equals_the_code_written_from_the_whole_node_list() -> None:
    gm = mixed_gm()
    assert len(gm.graph.nodes) >= LARGE
    gen = fxcodegen.generate(gm)
    assert gen.code == whole_list_code(gm)
    assert "**{" in gen.code and "float('inf')" in gen.code and gen.code.isascii()
    assert "(2.5,)" not in gen.code and "(1, 2.5)" in gen.code
    x = torch.arange(3.0)
    fn = fxcodegen.compile_execution_fn(
        gen.code, {n: gm.get_submodule(n) for n in gen.submod_names}, gen.submod_names, gen.consts
    )
    out, (x2, s2) = fn(x)
    want, _ = fx.Interpreter(gm).run(x, 3)
    assert torch.equal(out, want) and x2 is x and s2 == 3


def params_gm(n: int) -> fx.GraphModule:
    """``n - 2`` parameters, one add of two of them, the output: a root handed to the helper
    (``n`` >= 4,096) whose module is small (about 20 bytes a parameter)."""
    g = fx.Graph()
    params = [g.placeholder(f"p{k}") for k in range(n - 2)]
    g.output(g.call_function(operator.add, (params[0], params[-1])))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize(
    ("layers", "min_bytes"),
    [(4500, 128 << 10), (19000, 4 << 20)],
    ids=["populated-by-the-helper", "filled-in-two-halves"],
)
def test_a_large_written_module_is_the_same(layers: int, min_bytes: int) -> None:
    """From 128 KiB on, the helper that wrote a root stays on to populate the pages of the str
    the module is assembled into (its spare batches are freed after, not before); from 4 MiB
    on, the module is filled in two halves, the second on a thread of its own, split at a
    statement about halfway (never inside a call fused with its getitem). Either way the code,
    on a first call and on one reusing the kept buffers, is still the whole list's."""
    gm = mixed_gm(layers)
    want = whole_list_code(gm)
    assert len(want) >= min_bytes
    assert fxcodegen.generate(gm).code == want
    assert fxcodegen.generate(gm).code == want


def test_written_roots_generated_from_several_threads_are_the_same() -> None:
    """Calls from several Python threads each have their own helper, which polls for work
    while another call holds the GIL: every call still writes the whole list's code, for roots
    whose `str` the helper populates (128 KiB and more) and roots below that."""
    gms = [mixed_gm(4500), params_gm(4200)]
    wants = [whole_list_code(gm) for gm in gms]
    assert len(wants[0]) >= 128 << 10 > len(wants[1])
    assert len(gms[1].graph.nodes) >= LARGE
    got: list[bool] = []

    def work(k: int) -> None:
        for i in range(4):
            j = (i + k) % len(gms)
            got.append(fxcodegen.generate(gms[j]).code == wants[j])

    assert not run_in_threads(4, work)
    assert got == [True] * 16


@pytest.mark.parametrize("n", [LARGE, LARGE + 1, 5 * 1024, 5 * 1024 + 1, 3 * LARGE - 1])
def test_roots_ending_at_and_around_batch_ends(n: int) -> None:
    gm = chain_gm(n)
    assert len(gm.graph.nodes) == n
    assert fxcodegen.generate(gm).code == whole_list_code(gm)


def test_a_written_root_follows_the_layout_entry_name_and_header() -> None:
    """A written root is counted on the helper for the layout it was given: under another entry
    name and without the imports the code still equals the whole list's (a miscount would
    only cost a recount, never a different source)."""
    from fxcodegen import _core
    from fxcodegen.codegen import _resolve_target

    gm = mixed_gm()
    want = whole_list_code(gm).replace("def execution_fn(", "def entry(", 1)
    for header in (True, False):
        code, _, _ = _core.generate(
            gm, _resolve_target, "native", "entry", True, None, None, header
        )
        imports = "import torch\nimport operator\n"
        assert code == (want if header else want.removeprefix(imports))
        assert code.startswith(imports) == header


def test_a_root_calling_an_inlined_child_is_read_again_whole() -> None:
    """An inlined child's function comes from the node list: the root is then read again,
    keeping its nodes, and the code is the same."""
    gm = chain_gm(LARGE + 500)
    child = chain_gm(10)
    gm.add_module("child", child)
    with gm.graph.inserting_before(list(gm.graph.nodes)[-1]):
        call = gm.graph.call_module("child", (list(gm.graph.nodes)[-2],))
    list(gm.graph.nodes)[-1].args = (call,)
    gm.recompile()
    gen = fxcodegen.generate(gm)
    assert "def __fx_f0(" in gen.code
    assert gen.code == whole_list_code(gm)


def errors(gm: fx.GraphModule) -> tuple[str, str]:
    with pytest.raises(fxcodegen.CodegenError) as streamed:
        fxcodegen.generate(gm)
    with pytest.raises(fxcodegen.CodegenError) as whole:
        fxcodegen.serialize(gm)
    return str(streamed.value), str(whole.value)


@pytest.mark.parametrize("at", [1023, 1024, 3000])
def test_nodes_after_the_output_fail_as_on_the_whole_list(at: int) -> None:
    g = fx.Graph()
    prev = x = g.placeholder("x")
    for _ in range(at - 1):
        prev = g.call_function(operator.add, (prev, x))
    g.output(prev)
    for _ in range(LARGE):
        prev = g.call_function(operator.add, (prev, x))
    streamed, whole = errors(fx.GraphModule(torch.nn.Module(), g))
    assert streamed == whole and "output" in streamed


def test_a_parameter_without_default_after_defaults_fails_as_on_the_whole_list() -> None:
    g = fx.Graph()
    for k in range(1500):
        g.placeholder(f"p{k}", default_value=k)
    late = g.placeholder("late")
    prev = late
    for _ in range(LARGE):
        prev = g.call_function(operator.add, (prev, late))
    g.output(prev)
    streamed, whole = errors(raw_gm(g))
    assert streamed == whole and "late" in streamed


def test_a_helper_thread_that_fails_costs_a_second_read_not_the_code() -> None:
    """The program keeps none of a root handed to the helper in full: should the helper end
    without writing it (its thread failed; a test hook makes it panic), the graph is read
    again and the code is the same."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import fxcodegen, test_codegen_streamed"
        " as T; gm = T.mixed_gm(); print(fxcodegen.generate(gm).code == T.whole_list_code(gm))"
    )
    env = {"FXCODEGEN_FAILPOINT": "helper"}
    run = fresh_python(script, env, str(Path(__file__).parent), check=True)
    assert run.stdout.strip() == "True"
    assert "FXCODEGEN_FAILPOINT=helper" in run.stderr  # the helper did fail
