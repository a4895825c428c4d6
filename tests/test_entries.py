"""Entries: bounds and hints given to the compiler, per-entry config, sharing, timings,
progress."""

from __future__ import annotations

import logging
import uuid

import fxcodegen
import pytest
import torch
from _piecewise_helpers import ATTENTION, capture
from fxcodegen import PiecewiseBackend, counters
from fxcodegen.entries import Bounds, Entry, entry_bounds, entry_config
from fxcodegen.example_args import fake_args
from fxcodegen.toy import make_decoder
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.utils._sympy.numbers import int_oo


@pytest.fixture(autouse=True)
def _clear_counters():
    counters.clear()
    yield
    counters.clear()


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + 1


@pytest.fixture(scope="module")
def small_gm() -> torch.fx.GraphModule:
    return capture(Small().eval().requires_grad_(False), (torch.randn(5, 8),)).graphs[0]


def _ranges_of(args: list) -> set[tuple]:
    """The value ranges of the symbols in ``args`` (their own ShapeEnv's view)."""
    out = set()
    for a in args:
        for d in [*a.shape] if isinstance(a, torch.Tensor) else [a]:
            if isinstance(d, torch.SymInt):
                for s in free_symbols(d):
                    vr = d.node.shape_env.var_to_range[s]
                    out.add((int(vr.lower), None if vr.upper == int_oo else int(vr.upper)))
    return out


def _recorder(seen: dict[Entry, list]):
    def compiler(graph, entry, example_args):
        seen.setdefault(entry, []).append(example_args)
        return graph

    return compiler


def test_entry_bounds_and_hint_point() -> None:
    traced = (2, None)  # what Dynamo gives a backed size
    assert entry_bounds(Entry("range", 1, 16), traced) == Bounds(2, 16, 16)
    assert entry_bounds(Entry("range", 17, 128), traced) == Bounds(17, 128, 128)
    # the hint: the point nearest Inductor's size for unknown sizes (8192)
    assert entry_bounds(Entry("range", 10_000, 20_000), traced) == Bounds(10_000, 20_000, 10_000)
    assert entry_bounds(Entry("range", 0, 2**63 - 1), traced) == Bounds(2, None, 8192)
    assert entry_bounds(Entry("range", 1, 2), traced).is_value  # [2, 2]: one value
    assert entry_bounds(Entry("range", 0, 1), traced) == Bounds(2, None, 8192)  # unreachable
    assert entry_bounds(Entry("size", 32, 32), traced) == Bounds(32, 32, 32)
    assert entry_bounds(Entry("static"), traced) is None


def test_compiler_gets_bounded_symbols_in_its_own_shape_env(small_gm) -> None:
    seen: dict[Entry, list] = {}
    dynamo_env = next(
        d.node.shape_env
        for a in fake_args(small_gm)
        for d in ([*a.shape] if isinstance(a, torch.Tensor) else [a])
        if isinstance(d, torch.SymInt)
    )
    guards_before = len(dynamo_env.guards)
    ranges_before = dict(dynamo_env.var_to_range)
    pb = PiecewiseBackend(
        small_gm, compile_ranges=[(1, 8), (9, 64)], compile_sizes=[16], compiler=_recorder(seen)
    )
    assert _ranges_of(seen[Entry("range", 1, 8)][0]) == {(2, 8)}
    assert _ranges_of(seen[Entry("range", 9, 64)][0]) == {(9, 64)}
    assert _ranges_of(seen[Entry("size", 16, 16)][0]) == set()  # the size is baked in
    # every entry has a ShapeEnv of its own, none of them Dynamo's
    envs = {
        id(d.node.shape_env)
        for args in (v[0] for v in seen.values())
        for a in args
        for d in ([*a.shape] if isinstance(a, torch.Tensor) else [a])
        if isinstance(d, torch.SymInt) and free_symbols(d)
    }
    assert len(envs) == 2 and id(dynamo_env) not in envs
    assert len(dynamo_env.guards) == guards_before
    assert dict(dynamo_env.var_to_range) == ranges_before
    assert [str(pb.bounds[e]) for e in pb.entries] == [
        "in [2, 8] (hint 8)",
        "in [9, 64] (hint 64)",
        "= 16",
    ]


def test_per_entry_config_is_applied_and_keyed(small_gm) -> None:
    def config(entry: Entry) -> dict:
        return {"max_autotune": True} if entry.kind == "size" else {}

    pb = PiecewiseBackend(
        small_gm,
        compile_ranges=[(1, 8)],
        compile_sizes=[16],
        compiler="eager",
        inductor_config=config,
    )
    r, s = Entry("range", 1, 8), Entry("size", 16, 16)
    assert pb.entry_configs == {r: {}, s: {"max_autotune": True}}
    # Each entry is keyed by the config it gets: without patches the range keeps its key
    # and the size does not; the same patches given as a dict to every entry give the size
    # the same key and change the range's; another value of the option, another key.
    plain = PiecewiseBackend(
        small_gm, compile_ranges=[(1, 8)], compile_sizes=[16], compiler="eager"
    )
    assert plain.entry_keys[r] == pb.entry_keys[r] and plain.entry_keys[s] != pb.entry_keys[s]
    every = PiecewiseBackend(
        small_gm,
        compile_ranges=[(1, 8)],
        compile_sizes=[16],
        compiler="eager",
        inductor_config={"max_autotune": True},
    )
    assert every.entry_configs == {r: {"max_autotune": True}, s: {"max_autotune": True}}
    assert every.entry_keys[s] == pb.entry_keys[s] and every.entry_keys[r] != pb.entry_keys[r]
    off = PiecewiseBackend(
        small_gm,
        compile_ranges=[(1, 8)],
        compile_sizes=[16],
        compiler="eager",
        inductor_config={"max_autotune": False},
    )
    assert len({off.entry_keys[s], pb.entry_keys[s], plain.entry_keys[s]}) == 3
    assert entry_config({"a": 1}, r) == {"a": 1} and entry_config(None, r) == {}
    with pytest.raises(TypeError, match=r"inductor_config\('range:1-8'\) returned int"):
        PiecewiseBackend(small_gm, compile_ranges=[(1, 8)], inductor_config=lambda e: 3)


def test_entries_given_the_same_compile_share_it(small_gm) -> None:
    seen: dict[Entry, list] = {}
    # (1, 2) holds a single traced size (Dynamo traces sizes >= 2), so it is size 2
    pb = PiecewiseBackend(
        small_gm, compile_ranges=[(1, 2), (3, 8)], compile_sizes=[2], compiler=_recorder(seen)
    )
    assert pb.compile_keys[Entry("range", 1, 2)] == pb.compile_keys[Entry("size", 2, 2)]
    assert pb.how == {
        Entry("range", 1, 2): "compiled",
        Entry("range", 3, 8): "compiled",
        Entry("size", 2, 2): "shared",
    }
    assert (counters["compile"], counters["compile_shared"]) == (2, 1)
    assert Entry("size", 2, 2) not in seen
    # different config patches: not the same compile
    counters.clear()
    pb = PiecewiseBackend(
        small_gm,
        compile_ranges=[(1, 2)],
        compile_sizes=[2],
        compiler=_recorder({}),
        inductor_config=lambda e: {"max_autotune": e.kind == "size"},
    )
    assert (counters["compile"], counters["compile_shared"]) == (2, 0)
    # ranges with different bounds never share
    counters.clear()
    pb = PiecewiseBackend(small_gm, compile_ranges=[(1, 8), (9, 64)], compiler="eager")
    assert len(set(pb.compile_keys.values())) == 2
    assert (counters["compile"], counters["compile_shared"]) == (2, 0)


def _demo_like_backend(**kwargs) -> tuple[fxcodegen.backend, torch.nn.Module]:
    model = make_decoder(num_layers=3, hidden=16, heads=2)
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION],
        compile_ranges=[(1, 16), (17, 128)],
        compile_sizes=[32],
        cache_dir=False,
        **kwargs,
    )
    return be, model


@pytest.mark.usefixtures("fresh_dynamo")
def test_no_duplicate_compiles_counts_and_timings(caplog) -> None:
    be, model = _demo_like_backend(compiler="eager", progress=False)
    compiled = torch.compile(model, backend=be, dynamic=True)
    with caplog.at_level(logging.INFO, logger="fxcodegen"), torch.no_grad():
        x = torch.randn(20, 16)
        torch.testing.assert_close(compiled(x), model(x))
        rec = be.graphs[0]
        assert rec.first_run_s is not None and rec.first_run_s > 0
        first = rec.first_run_s
        compiled(torch.randn(21, 16))
    assert rec.first_run_s == first  # only the first call is timed
    compiled_keys = [
        p.compile_keys[e] for p in rec.pieces.values() for e in p.entries if p.how[e] == "compiled"
    ]
    # every compile got something no other compile got: no duplicates
    assert len(compiled_keys) == len(set(compiled_keys)) == rec.compiled == 3 * 3
    assert (rec.reused, rec.shared, rec.num_entries) == (3, 0, 12)
    assert rec.trace_s is not None and rec.trace_s > 0
    assert rec.split_s > 0 and rec.compile_s > 0 and rec.codegen_s > 0
    assert set(rec.compile_by_kind) == {"range", "size"}
    # one line per graph with its summary and timings, logged after the first run
    lines = [r.getMessage() for r in caplog.records if "first run" in r.getMessage()]
    assert len(lines) == 1
    assert "graph 0 (symbolic)" in lines[0] and "9 compiled, 3 reused, 0 shared" in lines[0]
    for part in ("trace ", "split ", "compile ", "range ", "size ", "load ", "codegen "):
        assert part in lines[0]
    # without a progress bar each piece-entry is a log line
    assert "graph 0: submod_0 [range (1, 16)] (1/12)" in caplog.text


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
def test_cache_path_labels_entries_as_the_plain_path_does(tmp_path) -> None:
    """A cold start through the artifact cache compiles entry by entry ahead of building the
    pieces; the pieces must still label each entry as compiled, reused or shared exactly
    as without the cache (size 2 shares range (1, 2); identical pieces reuse)."""
    hows = {}
    for compiler, cache_dir in (("eager", False), ("inductor", tmp_path / "cache")):
        torch._dynamo.reset()
        counters.clear()
        model = make_decoder(num_layers=3, hidden=16, heads=2)
        be = fxcodegen.backend(
            splitting_ops=[ATTENTION],
            compile_ranges=[(1, 2), (3, 64)],
            compile_sizes=[2],
            compiler=compiler,
            cache_dir=cache_dir,
            progress=False,
        )
        with torch.no_grad():
            x = torch.randn(20, 16)
            torch.testing.assert_close(torch.compile(model, backend=be, dynamic=True)(x), model(x))
        (rec,) = be.graphs
        hows[compiler] = {n: [p.how[e] for e in p.entries] for n, p in rec.pieces.items()}
        # compiles done ahead of the pieces (the cache path) keep their time: most of an
        # Inductor graph's compile time is its entries' compiles
        compiled_s = sum(
            p.entry_seconds[e]
            for p in rec.pieces.values()
            for e in p.entries
            if p.how[e] == "compiled"
        )
        assert compiled_s == pytest.approx(sum(rec.compile_by_kind.values()))
        if compiler == "inductor":  # eager "compiles" take microseconds
            assert compiled_s >= 0.5 * rec.compile_s, (compiled_s, rec.compile_s)
        got = {k: counters[k] for k in ("compile", "compile_reused", "compile_shared")}
        assert got == {
            "compile": rec.compiled,
            "compile_reused": rec.reused,
            "compile_shared": rec.shared,
        }
    assert be.graphs[0].cache == "miss"
    own = ["compiled", "compiled", "shared"]
    assert hows["eager"] == {
        "submod_0": own,
        "submod_2": own,
        "submod_4": ["reused", "reused", "shared"],  # the same layer as submod_2
        "submod_6": own,
    }
    assert hows["inductor"] == hows["eager"]


@pytest.mark.usefixtures("fresh_dynamo")
def test_progress_bar_names_piece_and_entry(capsys) -> None:
    be, model = _demo_like_backend(compiler="eager", progress=True)
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        compiled(torch.randn(20, 16))
    err = capsys.readouterr().err
    assert "12/12 piece-entries" in err
    assert "submod_0 [range (1, 16)]" in err and "submod_6 [size 32]" in err


@pytest.mark.parametrize("value", ["yes", "2", "true", " 1"])
def test_bad_progress_variable_is_an_error(monkeypatch, value: str) -> None:
    monkeypatch.setenv("FXCODEGEN_PROGRESS", value)
    with pytest.raises(ValueError, match=rf"FXCODEGEN_PROGRESS={value!r} is not understood"):
        fxcodegen.backend(splitting_ops=[ATTENTION], cache_dir=False)


@pytest.mark.parametrize(("value", "want"), [("", None), ("0", False), ("1", True)])
def test_good_progress_values(monkeypatch, value: str, want) -> None:
    monkeypatch.setenv("FXCODEGEN_PROGRESS", value)
    be = fxcodegen.backend(splitting_ops=[ATTENTION], cache_dir=False)
    assert be.progress_env is want


# --------------------------------------------------------------------------------------
# Inductor


class RecordRanges(CustomGraphPass):
    """A post-grad pass recording the value range of every symbol in the graph's inputs,
    as Inductor sees it while compiling."""

    def __init__(self) -> None:
        self.seen: list[set[tuple]] = []
        # A fresh uuid per instance: Inductor's caches never serve a compile that skipped
        # this pass (whose effect, recording, is per instance).
        self.nonce = uuid.uuid4().hex

    def __call__(self, graph: torch.fx.Graph) -> None:
        vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
        self.seen.append(_ranges_of(vals))

    def uuid(self) -> str:
        return f"fxcodegen-test-record-ranges-{self.nonce}"


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_dynamo")
def test_bounds_reach_inductor_and_never_dynamo() -> None:
    passes: dict[str, RecordRanges] = {}

    def config(entry: Entry) -> dict:
        return {"post_grad_custom_post_pass": passes.setdefault(entry.label, RecordRanges())}

    model = make_decoder(num_layers=2, hidden=16, heads=2)
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION],
        compile_ranges=[(1, 8), (9, 64)],
        compile_sizes=[12],
        cache_dir=False,
        inductor_config=config,
        progress=False,
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        x = torch.randn(30, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        rec = be.graphs[0]
        # inside Inductor, each range entry's symbol has exactly the entry's range (sizes
        # from 2: Dynamo traces 0 and 1 as their own static graph); the size is baked in
        assert passes["range:1-8"].seen and passes["range:9-64"].seen
        assert all(s == {(2, 8)} for s in passes["range:1-8"].seen)
        assert all(s == {(9, 64)} for s in passes["range:9-64"].seen)
        assert all(s == set() for s in passes["size:12"].seen)
        # Dynamo's own symbol keeps its range: nothing the compiles did reached it
        sym = rec.dispatch_symbol.symbol
        env = next(iter(rec.pieces.values())).graph
        dyn_env = next(
            d.node.shape_env
            for a in fake_args(env)
            for d in ([*a.shape] if isinstance(a, torch.Tensor) else [a])
            if isinstance(d, torch.SymInt) and sym in free_symbols(d)
        )
        vr = dyn_env.var_to_range[sym]
        assert (int(vr.lower), vr.upper) == (2, int_oo)
        # sizes in the other range and the size run without a Dynamo recompile, correctly
        for n in (2, 8, 9, 12, 64):
            x = torch.randn(n, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert len(be.graphs) == 1
        assert rec.compile_by_kind.keys() == {"range", "size"}
        assert rec.first_run_s is not None


def test_guards_the_range_does_not_prove_are_reported() -> None:
    from fxcodegen.compile_entry import unproven_guards
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    s = env.create_symbol(10, ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC)
    env.constrain_symbol_range(s, compiler_min=2, compiler_max=16)
    n = env.create_symintnode(s, hint=10)
    assert unproven_guards(env, s, 2, 16) == []
    assert n >= 2  # implied by the range: no guard needed
    assert unproven_guards(env, s, 2, 16) == []
    assert n > 8  # true at the hint, not on [2, 16]: a guard
    assert unproven_guards(env, s, 2, 16) == [f"{s} > 8"]
    assert unproven_guards(env, s, 9, 16) == []  # a range it holds on
