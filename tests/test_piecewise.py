from __future__ import annotations

import json
import re
from pathlib import Path

import fxcodegen
import pytest
import torch
from _piecewise_helpers import ATTENTION, capture, graph_with_examples
from conftest import fresh_python
from fxcodegen import (
    OutOfRangeError,
    PiecewiseBackend,
    Range,
    counters,
    split_graph,
)
from fxcodegen.example_args import concrete_args, fake_args, is_symbolic
from fxcodegen.fingerprint import structural_key
from fxcodegen.piecewise import CompiledPool, Entry
from fxcodegen.toy import make_decoder


class Small(torch.nn.Module):
    def __init__(self, width: int = 8, scale: float = 2.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2 + 1


@pytest.fixture(autouse=True)
def _clear_counters():
    counters.clear()
    yield
    counters.clear()


def real_args_for(gm: torch.fx.GraphModule, template: tuple):
    """Real arguments for ``gm`` at any size: symbolic positions made anew (random tensors,
    the size itself), the others (weights) taken from ``template``."""
    examples = fake_args(gm)

    def args_for(n: int) -> tuple:
        fresh = concrete_args(gm, n, fake=False)
        out = []
        for ex, new, old in zip(examples, fresh, template, strict=True):
            if not is_symbolic(ex):
                out.append(old)
            elif isinstance(new, torch.Tensor):
                out.append(new.normal_())
            else:
                out.append(new)
        return tuple(out)

    return args_for


@pytest.fixture(scope="module")
def small():
    """A symbolic Dynamo graph of ``Small`` and a function making its real arguments."""
    model = Small().eval().requires_grad_(False)
    cap = capture(model, (torch.randn(5, 8),))
    gm = cap.graphs[0]
    _, args = cap.calls[0]
    return gm, real_args_for(gm, args)


def _size_index(gm: torch.fx.GraphModule) -> int:
    (index,) = [i for i, v in enumerate(fake_args(gm)) if isinstance(v, torch.SymInt)]
    return index


def _recording_compiler(seen: list[Entry], examples: dict[Entry, list]):
    def compiler(graph, entry, example_args):
        examples[entry] = example_args

        def run(*args):
            seen.append(entry)
            return graph(*args)

        return run

    return compiler


def test_dispatch_exact_sizes_first_then_ranges_at_boundaries(small) -> None:
    gm, args_for = small
    seen: list[Entry] = []
    examples: dict[Entry, list] = {}
    pb = PiecewiseBackend(
        gm,
        compile_ranges=[(9, 64), Range(1, 8)],  # unsorted on purpose
        compile_sizes=[16, 4],
        sym_shape_indices=[_size_index(gm)],
        compiler=_recording_compiler(seen, examples),
    )
    r1, r2 = Entry("range", 1, 8), Entry("range", 9, 64)
    s4, s16 = Entry("size", 4, 4), Entry("size", 16, 16)
    assert pb.entries == [r1, r2, s4, s16]
    assert counters["compile"] == 4  # everything compiled at construction
    # single sizes get concrete example args, ranges symbolic ones
    assert not any(is_symbolic(v) for v in examples[s16])
    assert (16, 8) in [tuple(v.shape) for v in examples[s16] if isinstance(v, torch.Tensor)]
    assert any(is_symbolic(v) for v in examples[r1])

    cases = [(1, r1), (3, r1), (4, s4), (8, r1), (9, r2), (15, r2), (16, s16), (17, r2), (64, r2)]
    for n, want in cases:
        seen.clear()
        out = pb(*args_for(n))
        assert seen == [want], n
        assert pb.entry_for(n) == want
        assert out[0].shape == (n, 8)
    assert counters["compile"] == 4  # nothing compiled at call time


@pytest.mark.parametrize("size", [0, 65, 10**6])
def test_out_of_range_names_value_and_ranges(small, size: int) -> None:
    gm, args_for = small
    pb = PiecewiseBackend(
        gm, compile_ranges=[(1, 8), (9, 64)], compile_sizes=[100], compiler="eager"
    )
    with pytest.raises(OutOfRangeError, match=rf"size {size} .*\(1, 8\), \(9, 64\); sizes: 100"):
        pb(*args_for(size))
    with pytest.raises(OutOfRangeError):
        pb.entry_for(size)


def test_eager_compiler_matches_graph_and_default_range_covers_all(small) -> None:
    gm, args_for = small
    pb = PiecewiseBackend(gm, compiler="eager")
    assert pb.sym_shape_indices == [_size_index(gm)]  # found from the placeholders
    assert pb.entries == [Entry("range", 0, 2**63 - 1)]
    for n in (1, 7, 300):
        args = args_for(n)
        torch.testing.assert_close(pb(*args), gm(*args))
    assert counters["compile"] == 1


def test_static_piece_has_a_single_entry() -> None:
    model = Small().eval().requires_grad_(False)
    cap = capture(model, (torch.randn(5, 8),), dynamic=False)
    gm = cap.graphs[0]
    _, args = cap.calls[0]
    pb = PiecewiseBackend(gm, compile_ranges=[(1, 8), (9, 16)], compile_sizes=[5], compiler="eager")
    assert pb.entries == [Entry("static")] and pb.sym_shape_indices == []
    torch.testing.assert_close(pb(*args), gm(*args))
    assert counters["compile"] == 1


def test_constructor_errors(small) -> None:
    gm, _ = small
    with pytest.raises(ValueError, match="overlap"):
        PiecewiseBackend(gm, compile_ranges=[(1, 8), (8, 16)], compiler="eager")
    with pytest.raises(ValueError, match="unknown compiler 'tvm'"):
        PiecewiseBackend(gm, compiler="tvm")
    with pytest.raises(ValueError, match="out of range"):
        PiecewiseBackend(gm, sym_shape_indices=[17], compiler="eager")
    with pytest.raises(ValueError, match="at least one"):
        PiecewiseBackend(gm, compile_ranges=[], compiler="eager")
    with pytest.raises(ValueError, match=">= 0"):
        PiecewiseBackend(gm, compile_sizes=[-2], compiler="eager")
    with pytest.raises(TypeError, match="compile range"):
        PiecewiseBackend(gm, compile_ranges=[5], compiler="eager")
    with pytest.raises(TypeError, match="GraphModule"):
        PiecewiseBackend(torch.nn.Linear(2, 2), compiler="eager")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a callable"):
        PiecewiseBackend(gm, compiler=lambda g, e, a: 42)


# ------------------------------------------------------------------------------------
# identical pieces


@pytest.fixture(scope="module")
def decoder_pieces():
    model = make_decoder(num_layers=4, hidden=16, heads=2)
    cap = capture(model, (torch.randn(6, 16),))
    gm = cap.graphs[0]
    split_gm, items = split_graph(gm, [ATTENTION])
    _, args = cap.calls[0]
    return gm, split_gm, items, args


def test_structural_key_equal_for_identical_layers(decoder_pieces) -> None:
    _, _, items, _ = decoder_pieces
    keys = {it.submod_name: structural_key(it.graph) for it in items}
    # first piece (prep), three identical middles, last piece (with final norm)
    assert keys["submod_2"] == keys["submod_4"] == keys["submod_6"]
    assert len({keys["submod_0"], keys["submod_2"], keys["submod_8"]}) == 3
    assert keys["submod_1"] == keys["submod_3"]  # splitting pieces too
    # the key ignores names: the middle pieces' placeholders are named differently
    names = [[n.name for n in items[i].graph.graph.nodes if n.op == "placeholder"] for i in (2, 4)]
    assert names[0] != names[1]


def test_identical_pieces_compile_once_and_run_correctly(decoder_pieces) -> None:
    gm, split_gm, items, args = decoder_pieces
    pool = CompiledPool()
    compiled = {}
    for it in items:
        if not it.is_splitting_graph:
            compiled[it.submod_name] = PiecewiseBackend(
                it.graph, compile_ranges=[(1, 8), (9, 64)], compiler="eager", pool=pool
            )
    # 5 pieces x 2 entries; 3 distinct pieces
    assert counters["compile"] == 3 * 2
    assert counters["compile_reused"] == 2 * 2
    assert len(pool) == 6
    assert compiled["submod_4"].entry_keys == compiled["submod_2"].entry_keys
    assert compiled["submod_0"].entry_keys != compiled["submod_2"].entry_keys
    # the shared result computes each layer with its own weights
    import copy

    stitched = copy.deepcopy(split_gm)
    for name, pb in compiled.items():
        setattr(stitched, name, pb)
    torch.testing.assert_close(stitched(*args), gm(*args))


def _key_of(fn, *inputs, dynamic=True) -> str:
    return structural_key(capture(fn, inputs, dynamic=dynamic).graphs[0])


def test_structural_key_separates_what_changes_compiled_code() -> None:
    x = torch.randn(4, 8)
    base = _key_of(lambda t: torch.relu(t) * 2, x)
    assert _key_of(lambda u: torch.relu(u) * 2, x) == base  # names do not matter
    assert _key_of(lambda t: torch.relu(t) * 3, x) != base  # constant
    assert _key_of(lambda t: torch.sigmoid(t) * 2, x) != base  # op
    assert _key_of(lambda t: torch.relu(t) * 2, x.double()) != base  # dtype
    static = _key_of(lambda t: torch.relu(t) * 2, x, dynamic=False)
    assert static != base  # symbolic vs static shape
    assert _key_of(lambda t: torch.relu(t) * 2, torch.randn(4, 9), dynamic=False) != static  # shape
    noncontig = torch.randn(8, 4).t()
    assert _key_of(lambda t: torch.relu(t) * 2, noncontig, dynamic=False) != static  # strides
    # weights differ but are inputs: equal; widths differ: different
    assert _key_of(Small(8).eval(), x) == _key_of(Small(8).eval(), x)
    assert _key_of(Small(16).eval(), torch.randn(4, 16)) != _key_of(Small(8).eval(), x)


def test_structural_key_device_offset_and_held_constants() -> None:
    cpu = graph_with_examples([torch.empty(3, 4)])
    assert structural_key(cpu) == structural_key(graph_with_examples([torch.empty(3, 4)]))
    assert structural_key(cpu) != structural_key(
        graph_with_examples([torch.empty(3, 4, device="meta")])
    )
    shifted = torch.empty(20)[2:14].view(3, 4)
    assert structural_key(cpu) != structural_key(graph_with_examples([shifted]))

    class Holds(torch.nn.Module):
        def __init__(self, c: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("c", c)

        def forward(self, x):
            return x + self.c

    a = torch.fx.symbolic_trace(Holds(torch.ones(3)))
    b = torch.fx.symbolic_trace(Holds(torch.ones(3)))
    c = torch.fx.symbolic_trace(Holds(torch.full((3,), 2.0)))
    assert structural_key(a) == structural_key(b)  # equal held values may share
    assert structural_key(a) != structural_key(c)  # different held values never do


# ------------------------------------------------------------------------------------
# cache seam (no compiler needed)


def test_entry_labels_and_keys(small) -> None:
    gm, _ = small
    pb = PiecewiseBackend(gm, compile_ranges=[(1, 8)], compile_sizes=[4], compiler="eager")
    labels = [e.label for e in pb.entries]
    assert labels == ["range:1-8", "size:4"]
    assert [Entry.from_label(lbl) for lbl in labels] == pb.entries
    assert Entry.from_label("static") == Entry("static")
    for bad in ("range:8-1", "size:x", "bogus", "static:1"):
        with pytest.raises(ValueError, match="entry label"):
            Entry.from_label(bad)
    keys = list(pb.entry_keys.values())
    assert len(set(keys)) == 2 and all(re.fullmatch("[0-9a-f]{64}", k) for k in keys)

    def keys_with(**options) -> dict:
        options = {"compile_ranges": [(1, 8)], "compile_sizes": [4], "compiler": "eager"} | options
        return PiecewiseBackend(gm, **options).entry_keys

    def custom(graph, entry, example_args):
        return graph

    # the same piece and options: the same keys (a fresh process too: the test below);
    # another compiler or config patches: another key for every entry
    assert keys_with() == pb.entry_keys
    for other in (keys_with(compiler=custom), keys_with(inductor_config={"max_autotune": True})):
        assert other.keys() == pb.entry_keys.keys()
        assert not set(other.values()) & set(keys)


def test_entry_keys_are_the_same_in_a_fresh_process(small) -> None:
    # what lets another process (or machine) load the artifacts stored under them
    gm, _ = small
    pb = PiecewiseBackend(gm, compile_ranges=[(1, 8)], compile_sizes=[4], compiler="eager")
    code = (
        "import json, sys, torch; sys.path[:0] = sys.argv[1:]\n"
        "from _piecewise_helpers import capture\n"
        "from fxcodegen import PiecewiseBackend\n"
        "from test_piecewise import Small\n"
        "torch.manual_seed(1)  # other weights: they are inputs, not in the key\n"
        "gm = capture(Small().eval().requires_grad_(False), (torch.randn(5, 8),)).graphs[0]\n"
        "pb = PiecewiseBackend(gm, compile_ranges=[(1, 8)], compile_sizes=[4], compiler='eager')\n"
        "print(json.dumps({e.label: k for e, k in pb.entry_keys.items()}))\n"
    )
    tests = str(Path(__file__).resolve().parent)
    pkg_parent = str(Path(fxcodegen.__file__).resolve().parents[1])
    out = fresh_python(code, {}, tests, pkg_parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {e.label: k for e, k in pb.entry_keys.items()}


def test_seam_errors_without_a_compiler(small) -> None:
    gm, _ = small
    pb = PiecewiseBackend(gm, compiler="eager")
    assert not pb.exportable
    with pytest.raises(ValueError, match="no artifacts"):
        pb.export_artifacts()
    with pytest.raises(KeyError, match="compile_missing=False"):
        PiecewiseBackend(gm, compiler="inductor", artifacts={}, compile_missing=False)
    assert counters["compile"] == 1


@pytest.mark.slow
def test_inductor_entries_export_and_load_without_compiling(small) -> None:
    gm, args_for = small
    pb = PiecewiseBackend(gm, compile_ranges=[(1, 32)], compile_sizes=[4], compiler="inductor")
    assert counters["compile"] == 2
    for n in (1, 4, 5, 32):
        args = args_for(n)
        torch.testing.assert_close(pb(*args), gm(*args))
    with pytest.raises(OutOfRangeError, match="size 33"):
        pb(*args_for(33))

    arts = pb.export_artifacts()
    assert set(arts) == set(pb.entry_keys.values())
    assert all(isinstance(b, bytes) and len(b) > 1000 for b in arts.values())

    counters.clear()
    loaded = PiecewiseBackend(
        gm,
        compile_ranges=[(1, 32)],
        compile_sizes=[4],
        compiler="inductor",
        artifacts=arts,
        compile_missing=False,
    )
    assert counters["compile"] == 0
    assert counters["artifact_loaded"] == 2
    for n in (2, 4, 31):
        args = args_for(n)
        torch.testing.assert_close(loaded(*args), gm(*args))
    assert loaded.export_artifacts() == arts  # re-export gives the same bytes


def test_a_closure_its_module_publishes_is_keyed_by_name() -> None:
    # torch._sym_sqrt (what math.sqrt of a SymFloat becomes) is a closure made at import;
    # keyed by identity, GPT-2's graphs could never be cached.
    from fxcodegen.fingerprint import structural_key_stable

    def local_closure(a, k=2.0):
        return a * k

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = 4.0
    graph.output(graph.call_function(torch._sym_sqrt, (x,)))
    assert torch._sym_sqrt.__closure__  # the premise: it is a closure
    _, stable = structural_key_stable(torch.fx.GraphModule({}, graph))
    assert stable

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = 4.0
    graph.output(graph.call_function(local_closure, (x,)))
    _, stable = structural_key_stable(torch.fx.GraphModule({}, graph))
    assert not stable
