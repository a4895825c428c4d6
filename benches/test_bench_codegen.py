"""Codegen speed: fxcodegen.generate against the reference (vLLM's algorithm), torch.fx and the
floor, on the stitching and inline-heavy shapes; compile() time of the emitted source; runtime
of the compiled stitching function. Speed is only reported here, never asserted; behaviour is
(the smoke run checks that every implementation's code runs and agrees)."""

from __future__ import annotations

import json
import mmap
import operator
from typing import Any

import fxcodegen
import pytest
import torch
import torch.fx as fx
from fxcodegen.bench import (
    call_overhead,
    cli,
    floor,
    host,
    impls,
    peak_rss,
    reference,
    runner,
    workloads,
)

IMPLS = ["fxcodegen", "reference", "torch.fx", "floor"]
ROUNDS = 5

_cache: dict[tuple[str, int], workloads.Workload] = {}


def _workload(shape: str, size: int) -> workloads.Workload:
    key = (shape, size)
    if key not in _cache:
        _cache.clear()  # keep one large graph alive at a time
        _cache[key] = workloads.SHAPES[shape](size)
    return _cache[key]


def _rounds(smoke: bool) -> int:
    return 1 if smoke else ROUNDS


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", ["stitch", "inline"])
def test_generate(bench: Any, smoke: bool, shape: str, size: int, impl: str) -> None:
    wl = _workload(shape, size)
    fn = impls.available_impls([impl]).get(impl)
    assert fn is not None, f"{impl} is not available"
    bench.group = f"generate {shape} {wl.num_nodes} nodes"
    bench.extra_info["nodes"] = wl.num_nodes
    result = bench.pedantic(fn, args=(wl.gm,), rounds=_rounds(smoke), iterations=1)
    if impl == "floor":
        assert result == wl.num_nodes
    elif impl in ("fxcodegen", "reference"):
        assert "def execution_fn(" in result[0]


@pytest.mark.parametrize("impl", ["fxcodegen", "reference"])
@pytest.mark.parametrize("shape", ["stitch", "inline"])
def test_compile_source(bench: Any, smoke: bool, shape: str, size: int, impl: str) -> None:
    wl = _workload(shape, size)
    code = impls.available_impls([impl])[impl](wl.gm)[0]
    bench.group = f"compile() {shape} {wl.num_nodes} nodes"
    bench.extra_info["source_bytes"] = len(code)
    bench.pedantic(compile, args=(code, "<bench>", "exec"), rounds=_rounds(smoke), iterations=1)


@pytest.fixture(scope="module")
def runtime_fns() -> dict[str, Any]:
    layers = 128
    wl = workloads.stitch(2 * layers + 3, shared_child=False)
    callables = {f"submod_{i}": call_overhead.child_copy() for i in range(layers)}
    code, names, consts = reference.generate_execution_code(wl.gm)
    gen = fxcodegen.generate(wl.gm)
    return {
        "hand-written": call_overhead.handwritten(
            layers, [callables[f"submod_{i}"] for i in range(layers)]
        ),
        "vllm-layout": reference.compile_execution_fn(code, callables, names, consts),
        "fxcodegen": fxcodegen.compile_execution_fn(
            gen.code, callables, gen.submod_names, gen.consts
        ),
    }


@pytest.mark.parametrize("layout", ["hand-written", "vllm-layout", "fxcodegen"])
def test_runtime(bench: Any, smoke: bool, runtime_fns: dict[str, Any], layout: str) -> None:
    fn = runtime_fns[layout]
    x = torch.zeros(2)
    bench.group = "runtime: stitching fn over 128 trivial children"
    rounds, iterations = (1, 1) if smoke else (200, 50)
    assert bench.pedantic(fn, args=(x, 4), rounds=rounds, iterations=iterations) is x


# --- behaviour (cheap; asserted in every run, the smoke run included) ---------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("shape", ["stitch", "inline"])
def test_all_implementations_agree(shape: str) -> None:
    wl = workloads.SHAPES[shape](41, recompile=True)
    assert workloads.count_nodes(wl.gm) == wl.num_nodes
    assert floor.read_graph(wl.gm) == wl.num_nodes
    expected = wl.gm(*wl.args)  # torch.fx's own generated forward
    assert _same(fxcodegen.build(wl.gm)(*wl.args), expected)
    assert _same(reference.build(wl.gm)(*wl.args), expected)
    # torch.fx python_code on every graph the benchmark times, exec'd and run.
    assert len(impls.implementation("torch.fx")(wl.gm)) == (2 if shape == "inline" else 1)
    gen = fxcodegen.generate(wl.gm)
    code, _, consts = reference.generate_execution_code(wl.gm)
    if shape == "inline":
        # fxcodegen interns equal devices by value; the reference pools each object.
        n_devices = len([n for n in wl.gm.submod_0.graph.nodes if n.kwargs])
        assert len(consts) == 1 + n_devices  # one dtype, then every device object
        assert 0 < len(gen.consts) < len(consts)
    compile(gen.code, "<fxcodegen>", "exec")


def test_workloads_are_deterministic() -> None:
    for shape in ("stitch", "inline"):
        a, b = workloads.SHAPES[shape](101), workloads.SHAPES[shape](101)
        assert (
            reference.generate_execution_code(a.gm)[0] == reference.generate_execution_code(b.gm)[0]
        )
        assert fxcodegen.generate(a.gm).code == fxcodegen.generate(b.gm).code
    g = workloads.stitch(11).gm.graph
    assert [n.op for n in g.nodes][:4] == [
        "placeholder",
        "placeholder",
        "call_module",
        "call_function",
    ]
    assert [n.target for n in g.nodes][3] is operator.getitem


@pytest.mark.skipif(not workloads.model_available(), reason="toy decoder / split_graph missing")
def test_model_workload_agrees() -> None:
    wl = workloads.model(2)
    assert wl.meta["pieces"] >= 4
    expected = wl.meta["expected"]
    for fn in (fxcodegen.build(wl.gm), reference.build(wl.gm)):
        out = fn(*wl.args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, expected)
    assert floor.read_graph(wl.gm) == wl.num_nodes


def test_runtime_layouts_agree() -> None:
    rt = call_overhead.runtime(layers=8, number=5, repeat=3)  # raises if any layout disagrees
    assert set(rt["ns_per_call"]) >= {"hand-written", "vllm layout (reference)", "fxcodegen"}


def test_peak_memory_probe() -> None:
    m = peak_rss.peak_memory("stitch", 200, "fxcodegen")
    if m is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert m["nodes"] == 199 and m["source_bytes"] > 0 and m["peak_extra_bytes"] >= 0


def test_peak_memory_is_the_median_of_fresh_processes() -> None:
    if peak_rss.peak_memory("stitch", 30, "fxcodegen") is None:
        pytest.skip("no /proc/self/clear_refs here")
    chosen = impls.available_impls(["fxcodegen"])
    row = runner.run_shape("stitch", 30, chosen, 1, memory_runs=3)
    runs = row.peak_extra_runs["fxcodegen"]
    assert len(runs) == 3 and all(r >= 0 for r in runs)
    assert row.peak_extra_bytes["fxcodegen"] == sorted(runs)[1]
    assert row.as_dict()["peak_extra_runs"]["fxcodegen"] == runs


def test_page_cost_probe() -> None:
    cost = host.page_cost_us()
    assert cost is not None
    # A first write makes the kernel find and zero a page before the write itself.
    assert cost["resident"] > 0 and cost["fresh"] > 0


def test_cli_writes_table_and_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = cli.main(
        ["--shape", "stitch,inline", "--sizes", "30", "--repeat", "1", "--min-time", "0"]
        + ["--no-memory", "-q", "--json", str(out)]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert "| stitch |" in table and "| inline |" in table
    data = json.loads(out.read_text())
    assert {r["shape"] for r in data["rows"]} == {"stitch", "inline"}
    for r in data["rows"]:
        assert set(r["ns_per_node"]) == set(IMPLS)
        assert r["ratios"]["reference/fxcodegen"] > 0
    assert data["min_time_s"] == 0
    for r in data["rows"]:
        assert set(r["page_us"]) == {"before", "after"}
        assert all(set(c) == {"fresh", "resident"} for c in r["page_us"].values())
    assert all(set(r["faults_per_run"]) == set(IMPLS) for r in data["rows"])
    assert all(n == 1 for r in data["rows"] for n in r["runs"].values())
    assert cli.main(["--shape", "nope"]) == 2


def test_measure_adds_rounds_until_min_time() -> None:
    gm = workloads.stitch(4).gm
    calls: list[str] = []
    fns = {"a": lambda g: calls.append("a"), "b": lambda g: calls.append("b")}
    # No minimum: exactly `repeat` interleaved rounds.
    assert {k: len(v) for k, v in runner.measure(gm, fns, 3).items()} == {"a": 3, "b": 3}
    # A minimum no round can reach: rounds stop at the cap, every implementation in each.
    times = runner.measure(gm, fns, 3, min_time_s=3600, max_rounds=7)
    assert {k: len(v) for k, v in times.items()} == {"a": 7, "b": 7}
    assert calls.count("a") == calls.count("b") == 10


def test_run_shape_times_torch_fx_after_the_others() -> None:
    calls: list[str] = []

    def rec(name: str) -> Any:
        return lambda g: calls.append(name)

    fns = {name: rec(name) for name in ("torch.fx", "floor", "fxcodegen")}
    row = runner.run_shape("stitch", 30, fns, 3, memory=False, compile_repeat=1)
    timed = calls[len(fns) :]  # after one warm-up call each
    # The others alternate, three rounds; torch.fx's three runs come after all of theirs.
    assert timed[:6].count("floor") == timed[:6].count("fxcodegen") == 3
    assert timed[6:] == ["torch.fx"] * 3
    assert row.runs == {"floor": 3, "fxcodegen": 3, "torch.fx": 3}


def test_measure_counts_the_pages_a_run_faults_in() -> None:
    gm = workloads.stitch(4).gm
    pages = 256

    def fresh(g: Any) -> None:
        # A new mapping each run, every page written once: each write faults one page in.
        m = mmap.mmap(-1, pages * mmap.PAGESIZE)
        for i in range(0, len(m), mmap.PAGESIZE):
            m[i] = 1
        m.close()

    faults: dict[str, list[int]] = {}
    runner.measure(gm, {"fresh": fresh, "none": lambda g: None}, 3, faults=faults)
    assert len(faults["fresh"]) == len(faults["none"]) == 3
    assert all(f >= pages for f in faults["fresh"])
    assert all(f < pages for f in faults["none"])


def test_parse_sizes() -> None:
    assert cli.parse_sizes(["1k,10k", "1M", "2_000"]) == [1000, 10000, 1000000, 2000]
    with pytest.raises(ValueError):
        cli.parse_sizes(["x"])


def test_graph_builder_matches_create_node() -> None:
    # The fast node builder must produce what Graph.create_node would.
    wl = workloads.stitch(9)
    g = fx.Graph()
    x = g.placeholder("x")
    s = g.placeholder("s0")
    prev = x
    for i in range(3):
        out = g.create_node(
            "call_module",
            f"submod_{i}",
            (prev, x, s),
            {"scale": 0.5, "sizes": [s, 16]},
            f"submod_{i}",
        )
        prev = g.create_node("call_function", operator.getitem, (out, 0), name=f"getitem_{i}")
    g.output(prev)
    assert g.python_code("self").src == wl.gm.graph.python_code("self").src
    wl.gm.graph.lint()


def _script(name: str) -> Any:
    """``benches/<name>.py`` loaded as a module."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plot_script(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    plot = _script("plot")
    data = tmp_path / "r.json"
    rc = cli.main(
        ["--shape", "stitch", "--sizes", "20,40", "--repeat", "1", "--min-time", "0"]
        + ["--no-memory", "-q"]
        + ["--json", str(data)]
    )
    assert rc == 0
    png = tmp_path / "r.png"
    assert plot.main([str(data), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_alloc_trace_script() -> None:
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).with_name("alloc_trace.py")
    cmd = [sys.executable, str(script), "stitch", "300"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    source = len(fxcodegen.generate(workloads.stitch(300).gm).code)
    assert lines[0] == f"stitch 299 nodes: source {source:,} bytes"
    # The node list is read by the core's reader, and freed by the end of the call.
    made = [ln.split() for ln in lines[2:-1] if ln.split()[0] in ("m", "c")]
    assert any(ln[3].startswith("read::Reader::graph") for ln in made), out.stdout
    assert any(ln.split()[0] == "f" for ln in lines[2:-1])
    top = max(int(ln.split()[2]) for ln in lines[2:-1])
    assert (
        lines[-1]
        == f"at most {top} KiB over the start = {top * 1024 / source:.2f} times the source"
    )


def test_gc_cost_script(capsys: pytest.CaptureFixture[str]) -> None:
    gc_cost = _script("gc_cost")
    argv = ["--shape", "stitch", "--sizes", "200", "--rounds", "2", "--flush-mib", "1"]
    assert gc_cost.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "stitch 199 nodes, 2 rounds: median ns/node (faults)"
    settings = [
        "after the other",
        "back to back",
        "after the other + gc",
        "after the other + 1 MiB",
    ]
    rows = [(impl, s) for impl in ("fxcodegen", "floor") for s in settings]
    for line, (impl, setting) in zip(lines[1:], rows, strict=True):
        assert line.split()[0] == impl and line[13:41].strip() == setting
        assert float(line.split()[-2]) > 0
