"""The artifact cache through the backend: warm starts, moved caches, healing, many
processes, permissions, miss explanations, and what the key covers.

The Inductor tests share one Inductor cache directory (``TORCHINDUCTOR_CACHE_DIR``), warmed
by the first cold child, so that the compiles after it are Inductor FX-graph-cache hits
(seconds, not tens of seconds, on a 2-core machine). fxcodegen's own cache is always a fresh
directory; the warm start itself is checked against an *empty* Inductor cache directory, so
it owes nothing to Inductor's cache.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fxcodegen
import pytest
import torch
from conftest import host_details_in
from fxcodegen import cache as C
from fxcodegen import counters
from fxcodegen.backend import Backend
from fxcodegen.cache import Artifact, Cache, PieceRecord
from fxcodegen.cache.keys import fxcodegen_build
from fxcodegen.graph_key import graph_factors
from fxcodegen.pipeline import plan_pieces
from fxcodegen.toy import ATTENTION_OP, attention, make_decoder

TESTS = Path(__file__).resolve().parent
CHILD = TESTS / "_cache_child.py"
PKG_PARENT = Path(fxcodegen.__file__).resolve().parents[1]

# The model of every Inductor test here: 3 layers (4 compiled pieces, 2 of them identical:
# 3 distinct), one range and one size: 6 compiles, 2 reused, per cold start.
MODEL = {"layers": 3, "hidden": 16, "heads": 2}
RANGES = [[1, 8]]
SIZES = [4]
RUN_SIZES = [5, 3, 4]  # the first call is dynamic (5): one symbolic graph
DISTINCT_ENTRIES = 6
REUSED_ENTRIES = 2


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --------------------------------------------------------------------------------------
# Child processes


def _child_env(inductor_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG_PARENT), env.get("PYTHONPATH")]))
    env.pop("FXCODEGEN_CACHE_DIR", None)
    env.pop("FXCODEGEN_PROGRESS", None)
    return env


def _config(cache_dir: Path, **over: Any) -> str:
    cfg = {
        **MODEL,
        "ranges": RANGES,
        "compile_sizes": SIZES,
        "sizes": RUN_SIZES,
        "cache_dir": str(cache_dir),
    }
    cfg.update(over)
    return json.dumps(cfg)


def _parse(proc_out: str, proc_err: str, rc: int) -> dict[str, Any]:
    assert rc == 0, f"child failed ({rc}):\n{proc_err[-4000:]}"
    for line in proc_out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"no RESULT line:\n{proc_out[-2000:]}\n{proc_err[-4000:]}")


def run_child(cache_dir: Path, inductor_dir: Path, **over: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(CHILD), _config(cache_dir, **over)],
        env=_child_env(inductor_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return _parse(proc.stdout, proc.stderr, proc.returncode)


def _build_hash() -> str:
    """The ``fxcodegen_build`` key factor as the files are now (not cached)."""
    return fxcodegen_build.__wrapped__()[1]


def _skip_if_rebuilt(since: str) -> None:
    """Other processes may rebuild the package (e.g. ``maturin develop``) while a test
    runs; the key then changes by design (``fxcodegen_build``) and a warm run misses."""
    if _build_hash() != since:
        pytest.skip("fxcodegen was rebuilt while the test ran (the key changed, by design)")


@dataclass
class Shared:
    root: Path
    inductor_dir: Path
    cold_cache: Path
    cold: dict[str, Any]
    build: str


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    """One cold child: compiles into an empty fxcodegen cache (and warms the shared Inductor
    cache for the tests after it)."""
    root = tmp_path_factory.mktemp("cache-backend")
    inductor_dir = root / "inductor"
    cold_cache = root / "cold-cache"
    build = _build_hash()
    cold = run_child(cold_cache, inductor_dir)
    return Shared(root, inductor_dir, cold_cache, cold, build)


def _outputs(result: dict[str, Any]) -> list[Any]:
    return [(o["size"], o["out"]) for o in result["outputs"]]


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


# --------------------------------------------------------------------------------------
# Warm starts


@pytest.mark.slow
def test_cold_then_warm_in_separate_processes(shared: Shared, tmp_path: Path) -> None:
    cold = shared.cold
    assert [g["cache"] for g in cold["graphs"]] == ["miss"]
    assert cold["counters"] == {
        "compile": DISTINCT_ENTRIES,
        "compile_reused": REUSED_ENTRIES,
        "codegen": 1,
    }
    assert all(o["max_err_vs_eager"] < 1e-4 for o in cold["outputs"])
    assert cold["warnings"] == []

    # The warm process gets an empty Inductor cache: the artifact alone must suffice.
    warm = run_child(shared.cold_cache, tmp_path / "empty-inductor")
    _skip_if_rebuilt(shared.build)
    assert warm["warnings"] == []
    (g,) = warm["graphs"]
    assert g["cache"] == "hit" and g["key"] == cold["graphs"][0]["key"], warm["log"]
    # zero compiles, no codegen; identical pieces are shared on load too
    assert warm["counters"] == {
        "artifact_loaded": DISTINCT_ENTRIES,
        "compile_reused": REUSED_ENTRIES,
    }
    assert (g["compiled"], g["loaded"], g["reused"]) == (0, DISTINCT_ENTRIES, REUSED_ENTRIES)
    assert any("bound the stitching code (marshal)" in m for m in warm["log"]), warm["log"]
    assert _outputs(warm) == _outputs(cold)  # bit-identical

    # Owner-only on disk: the directory 0700, every file 0600.
    root = shared.cold_cache
    assert _mode(root) == 0o700
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len([p for p in files if p.suffix == ".fxc"]) == 1
    assert len(list((root / "blobs").iterdir())) == DISTINCT_ENTRIES  # stored once each
    for p in [root / "blobs", root / "locks"]:
        assert _mode(p) == 0o700, p
    for p in files:
        assert _mode(p) == 0o600, p
    # The factors hold no path, host name or process id.
    (factors_file,) = root.glob("*.factors.json")
    text = factors_file.read_text()
    assert host_details_in(text, str(shared.root)) == []
    assert f'"{cold["pid"]}"' not in text
    assert Cache(root).verify() == []


@pytest.mark.slow
def test_moved_cache_directory_still_hits(shared: Shared, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(shared.cold_cache, copy)
    moved = tmp_path / "elsewhere" / "deeper" / "cache"
    moved.parent.mkdir(parents=True, mode=0o700)
    shutil.move(str(copy), str(moved))
    result = run_child(moved, shared.inductor_dir)
    _skip_if_rebuilt(shared.build)
    (g,) = result["graphs"]
    assert g["cache"] == "hit" and g["compiled"] == 0
    assert result["counters"].get("compile", 0) == 0
    assert "codegen" not in result["counters"]
    assert _outputs(result) == _outputs(shared.cold)


# --------------------------------------------------------------------------------------
# Many processes


@pytest.mark.slow
def test_concurrent_processes_compile_each_entry_once(shared: Shared, tmp_path: Path) -> None:
    n = 6
    cache_dir = tmp_path / "shared-cache"
    go = tmp_path / "go"
    build = _build_hash()
    procs = []
    for i in range(n):
        ready = tmp_path / f"ready{i}"
        cfg = _config(cache_dir, ready=str(ready), go=str(go))
        procs.append(
            (
                ready,
                subprocess.Popen(
                    [sys.executable, str(CHILD), cfg],
                    env=_child_env(shared.inductor_dir),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    try:
        deadline = time.monotonic() + 300
        while not all(r.exists() for r, _ in procs):
            assert time.monotonic() < deadline, "children did not get ready"
            assert all(p.poll() is None for _, p in procs), "a child exited early"
            time.sleep(0.05)
        t_go = time.monotonic()
        go.write_text("go")
        results = []
        for _, p in procs:
            out, err = p.communicate(timeout=600)
            results.append(_parse(out, err, p.returncode))
        wall = time.monotonic() - t_go
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    graphs = [r["graphs"][0] for r in results]
    _skip_if_rebuilt(build)
    statuses = sorted(g["cache"] for g in graphs)
    keys = {g["key"] for g in graphs}
    assert len(keys) == 1
    # the processes split the piece-entries (docs/cache.md, "Cooperative compile"): each
    # entry compiled by exactly one of them, the rest loaded from what the others stored
    # (a process that starts after the artifact is stored loads it whole)
    assert set(statuses) <= {"miss", "hit"}, statuses
    compiled = [g["compiled"] for g in graphs]
    assert sum(compiled) == DISTINCT_ENTRIES, compiled
    assert all(g["compiled"] + g["loaded"] == DISTINCT_ENTRIES for g in graphs)
    assert sum(r["counters"].get("codegen", 0) for r in results) == statuses.count("miss")
    first = _outputs(results[0])
    assert all(_outputs(r) == first for r in results)
    assert first == _outputs(shared.cold)
    assert all(r["warnings"] == [] for r in results)
    assert Cache(cache_dir).verify() == []
    print(
        f"\n{n} processes: statuses {statuses}; compiles per process {compiled}; "
        f"all done {wall:.1f}s after the start signal; first-call latency per process "
        f"{[round(r['first_call_s'], 2) for r in results]}"
    )


# --------------------------------------------------------------------------------------
# In-process Inductor runs (warm shared Inductor cache)


def _compile(
    cache_dir: Any,
    *,
    ranges: list[list[int]] = RANGES,
    sizes: list[int] = SIZES,
) -> Backend:
    torch._dynamo.reset()
    model = make_decoder(num_layers=MODEL["layers"], hidden=MODEL["hidden"], heads=MODEL["heads"])
    be = fxcodegen.backend(
        splitting_ops=[ATTENTION_OP],
        compile_ranges=[tuple(r) for r in ranges],
        compile_sizes=sizes,
        cache_dir=cache_dir,
        progress=False,
    )
    compiled = torch.compile(model, backend=be, dynamic=True)
    with torch.no_grad():
        for n in RUN_SIZES:
            x = torch.randn(n, MODEL["hidden"], generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(be.graphs) == 1
    return be


@pytest.fixture
def inductor_env(shared: Shared, monkeypatch: pytest.MonkeyPatch) -> Shared:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared.inductor_dir))
    return shared


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _truncate(path: Path) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "truncated"


def _bit_flip(path: Path) -> str:
    data = bytearray(path.read_bytes())
    data[len(data) - 10] ^= 0x10
    path.write_bytes(bytes(data))
    return "checksum mismatch"


def _empty(path: Path) -> str:
    path.write_bytes(b"")
    return "empty file"


def _unknown_version(path: Path) -> str:
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 99)  # the format version follows the 8-byte magic
    path.write_bytes(bytes(data))
    return "unknown format version 99"


@pytest.mark.slow
def test_damaged_artifacts_heal_through_the_backend(
    inductor_env: Shared, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fxcodegen")
    root = tmp_path / "cache"
    be = _compile(root)
    assert be.graphs[0].cache == "miss"
    key = be.graphs[0].cache_key
    path = root / f"{key}.fxc"
    cache = Cache(root)

    for damage in (_truncate, _bit_flip, _empty, _unknown_version):
        reason = damage(path)
        caplog.clear()
        counters.clear()
        be = _compile(root)  # checks every output against eager
        rec = be.graphs[0]
        warned = _warnings(caplog)
        if damage is _unknown_version:  # a clean miss with a log line, not a warning
            assert reason in caplog.text and str(path) in caplog.text
        else:
            assert any(str(path) in w and reason in w for w in warned), (damage, warned)
        # a miss; the piece-entries themselves are intact in the cache's entry store
        # (cooperative compile), so they load and only the stitching is made again
        assert rec.cache == "miss" and (rec.compiled, rec.loaded) == (0, DISTINCT_ENTRIES)
        assert counters["codegen"] == 1
        assert cache.verify() == [], damage  # replaced by an intact artifact
        assert _mode(path) == 0o600

    # A checksum-valid artifact whose piece bytes do not load (e.g. written by a broken
    # tool): the load fails after the checksums pass; the backend warns, compiles afresh
    # and replaces it. No crash, no wrong result.
    art = cache.load(key)
    assert art is not None
    bad = Artifact(
        code=art.code,
        submod_names=art.submod_names,
        consts=art.consts,
        pieces=[
            PieceRecord(
                name=p.name,
                entries={label: b"not an inductor artifact" for label in p.entries},
                sym_shape_indices=p.sym_shape_indices,
                returns_tuple=p.returns_tuple,
                compile_ranges=p.compile_ranges,
                compile_sizes=p.compile_sizes,
            )
            for p in art.pieces
        ],
    )
    assert cache.store(key, art.factors, bad) is not None
    caplog.clear()
    counters.clear()
    be = _compile(root)
    rec = be.graphs[0]
    warned = _warnings(caplog)
    assert any("cannot use artifact" in w and str(path) in w for w in warned), warned
    assert rec.cache == "healed" and rec.compiled == DISTINCT_ENTRIES
    assert counters["artifact_loaded"] == 0  # the failed attempt is not counted
    assert [r for _, r in cache.verify() if r != "unreferenced blob"] == []

    # An older-format artifact (format 1: no pool) whose code reads the pool (the splitting
    # pieces' layout check is pooled) cannot be bound: it heals, never a wrong result.
    # test_cache_store covers loading format 1 itself.
    art = cache.load(key)
    assert art.consts, "the premise: this graph's code reads the pool"
    data, _ = C.encode_artifact(art, key, art.factors, version=1)
    path.write_bytes(data)
    caplog.clear()
    counters.clear()
    be = _compile(root)
    assert be.graphs[0].cache == "healed", caplog.text
    assert any("constant-pool slots that are not bound" in w for w in _warnings(caplog))
    assert counters["compile"] == DISTINCT_ENTRIES


@pytest.mark.slow
def test_read_only_cache_never_fails_torch_compile(
    inductor_env: Shared,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cache on a read-only file system (an image baked before the model changed): every
    open for writing there, lock files included, fails with EROFS (injected on top of the
    real system calls and the real filelock). Hits load; a miss and a heal compile without
    the cache, each backend warning once about the lock."""
    caplog.set_level(logging.INFO, logger="fxcodegen")
    root = tmp_path / "cache"
    be = _compile(root)
    assert be.graphs[0].cache == "miss"
    key = be.graphs[0].cache_key
    cache = Cache(root)
    good = cache.load(key)
    assert good is not None
    real_open = os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).startswith(str(root)) and flags & writing:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)

    caplog.clear()
    assert _compile(root).graphs[0].cache == "hit"
    assert _warnings(caplog) == []

    caplog.clear()
    counters.clear()
    be = _compile(root, ranges=[[1, 16]])  # another key: a miss (outputs checked inside)
    # the new range's entries compile; the size's entries are the first key's, read from
    # the (read-only) cache's entry store
    g = be.graphs[0]
    assert g.cache == "miss" and (g.compiled, g.loaded) == (3, DISTINCT_ENTRIES - 3)
    warned = [w for w in _warnings(caplog) if w.startswith("fxcodegen cache")]
    assert len(warned) == 1 and "lock" in warned[0] and "Read-only" in warned[0], warned

    # A checksum-valid artifact that does not load: the heal compiles without the cache.
    monkeypatch.setattr(os, "open", real_open)
    bad = Artifact(
        code=good.code,
        submod_names=good.submod_names,
        consts=good.consts,
        pieces=[
            PieceRecord(
                name=p.name,
                entries={label: b"not an inductor artifact" for label in p.entries},
                sym_shape_indices=p.sym_shape_indices,
                returns_tuple=p.returns_tuple,
            )
            for p in good.pieces
        ],
    )
    assert cache.store(key, good.factors, bad) is not None
    monkeypatch.setattr(os, "open", read_only)
    caplog.clear()
    be = _compile(root)
    assert be.graphs[0].cache == "healed"
    warned = _warnings(caplog)
    assert [w for w in warned if "lock" in w and "Read-only" in w] != [], warned
    ours = [w for w in warned if w.startswith("fxcodegen cache")]
    assert len(ours) == 2, warned  # the unusable artifact, and the lock
    left = cache.load(key)  # read-only: nothing was replaced
    assert left is not None
    assert {bytes(v) for p in left.pieces for v in p.entries.values()} == {
        b"not an inductor artifact"
    }


@pytest.mark.slow
def test_cache_dir_writable_by_others_is_bypassed(
    inductor_env: Shared, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fxcodegen")
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    be = _compile(root)  # compiles and runs correctly (checked inside)
    rec = be.graphs[0]
    assert rec.cache == "untrusted" and rec.compiled == DISTINCT_ENTRIES
    assert any("writable by others" in w and str(root) in w for w in _warnings(caplog))
    assert list(root.iterdir()) == []  # nothing read, nothing written
    assert _mode(root) == 0o777  # and left as it was


@pytest.mark.slow
def test_miss_explanation_names_the_differing_factor(
    inductor_env: Shared, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fxcodegen")
    root = tmp_path / "cache"
    first = _compile(root, ranges=[[1, 8]]).graphs[0]
    caplog.clear()
    second = _compile(root, ranges=[[1, 16]]).graphs[0]
    assert second.cache == "miss"
    lines = [r.getMessage() for r in caplog.records if "miss for" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    line = lines[0]
    assert f"miss for {second.cache_key[:16]}" in line
    assert f"nearest artifact {first.cache_key[:16]} differs in " in line
    assert line.split(" differs in ", 1)[1] == "compile_ranges: [[1, 8]] -> [[1, 16]]"


# --------------------------------------------------------------------------------------
# Configuration and the key (no Inductor)


def test_cache_dir_false_default_and_eager_bypass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    off = fxcodegen.backend(splitting_ops=[ATTENTION_OP], cache_dir=False)
    assert off.cache is None and off.cache_dir is False
    monkeypatch.setenv("FXCODEGEN_CACHE_DIR", str(tmp_path / "from-env"))
    default = fxcodegen.backend(splitting_ops=[ATTENTION_OP])
    assert default.cache is not None and default.cache.root == tmp_path / "from-env"
    assert not (tmp_path / "from-env").exists()  # created on first use only
    explicit = fxcodegen.backend(splitting_ops=[ATTENTION_OP], cache_dir=tmp_path / "x")
    assert explicit.cache.root == tmp_path / "x"

    # "eager" has nothing compiled to store: it never touches the cache directory.
    caplog.set_level(logging.INFO, logger="fxcodegen")
    model = make_decoder(num_layers=2, hidden=8, heads=2)
    be = fxcodegen.backend(splitting_ops=[ATTENTION_OP], compiler="eager", cache_dir=tmp_path / "e")
    compiled = torch.compile(model, backend=be, dynamic=True)
    x = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert be.cache is None and be.graphs[0].cache == "bypassed"
    assert "cache bypassed" in caplog.text
    assert not (tmp_path / "e").exists()
    assert counters["codegen"] == 1


class _WithConstants(torch.nn.Module):
    """A module whose traced graph holds tensor constants (``get_attr``): one used by a
    compiled piece, one passed to the splitting op (an inlined piece: the stitching code's
    constant pool)."""

    def __init__(self, c: float = 1.0, k: float = 2.0, w: float = 0.5) -> None:
        super().__init__()
        self.register_buffer("c", torch.full((4,), c))
        self.register_buffer("k", torch.full((3, 4), k))
        self.lin = torch.nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.fill_(w)
            self.lin.bias.fill_(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.lin(x) * self.c
        return attention(q, self.k, q, 2) + 1


def _with_examples(gm: torch.fx.GraphModule, *args: torch.Tensor) -> torch.fx.GraphModule:
    """``gm`` with example values on its nodes, as Dynamo gives them (what planning reads)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    return gm


def cache_factors(be: Backend, split_gm: torch.fx.GraphModule, items: list[Any]) -> Any:
    """The graph's cache factors, from its pieces planned with ``be``'s settings."""
    return graph_factors(be.settings, split_gm, plan_pieces(be.settings, items, None))


def _factors(module: torch.nn.Module, **backend_kwargs: Any) -> tuple[dict[str, Any], bool]:
    gm = _with_examples(torch.fx.symbolic_trace(module), torch.randn(3, 4))
    be = Backend(splitting_ops=[ATTENTION_OP], cache_dir=False, **backend_kwargs)
    split_gm, items = fxcodegen.split_graph(gm, be.splitting_ops)
    return cache_factors(be, split_gm, items)


def test_key_covers_baked_constants_and_nothing_host_specific(tmp_path: Path) -> None:
    base, stable = _factors(_WithConstants())
    assert stable
    key = C.compute_key(base)
    again, _ = _factors(_WithConstants())
    assert C.compute_key(again) == key  # new objects, same values: same key
    # A changed constant is a miss, whether the stitching code's pool bakes it in (the
    # split keeps get_attr at the top level: ``c``, ``k``) or a compiled piece does (the
    # traced Linear's weight inside the piece). The serialized node list alone would not
    # see either.
    for changed, where in (
        (_WithConstants(c=3.0), ["extra.values"]),
        (_WithConstants(k=5.0), ["extra.values"]),
        (_WithConstants(w=0.25), ["extra.pieces.submod_0", "extra.values"]),
    ):
        factors, _ = _factors(changed)
        assert factors["graph"] == base["graph"]
        assert C.compute_key(factors) != key
        assert [d.split(":")[0] for d in C.explain_difference(factors, base)] == where
    # Inductor options and ranges are in the key.
    other, _ = _factors(_WithConstants(), inductor_config={"max_autotune": True})
    assert C.compute_key(other) != key
    assert [d.split(":")[0] for d in C.explain_difference(other, base)] == [
        "compiler_options.config_patches.max_autotune"
    ]
    ranged, _ = _factors(_WithConstants(), compile_ranges=[(1, 8)])
    assert [d.split(":")[0] for d in C.explain_difference(ranged, base)] == ["compile_ranges"]
    # No paths, host names or process ids.
    assert host_details_in(json.dumps(base), str(tmp_path)) == []
    assert set(base["extra"]) == {
        "key_version",
        "pieces",
        "values",
        "inductor_config",
        "range_dim",
        "devices",
    }
    assert base["extra"]["devices"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_global_inductor_config_is_in_the_key() -> None:
    import torch._inductor.config as inductor_config

    base, _ = _factors(_WithConstants())
    with inductor_config.patch(epilogue_fusion=not inductor_config.epilogue_fusion):
        changed, _ = _factors(_WithConstants())
    assert [d.split(":")[0] for d in C.explain_difference(changed, base)] == [
        "extra.inductor_config"
    ]


def test_graph_with_a_closure_is_not_cached(tmp_path: Path) -> None:
    scale = 2.0

    def local(t: torch.Tensor) -> torch.Tensor:
        return t * scale

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(local, (x,))
    a = graph.call_function(torch.ops.fxcodegen_toy.attention.default, (q, q, q, 2))
    graph.output(graph.call_function(local, (a,)))
    gm = _with_examples(torch.fx.GraphModule(torch.nn.Module(), graph), torch.randn(3, 4))
    be = Backend(splitting_ops=[ATTENTION_OP], cache_dir=tmp_path)
    split_gm, items = fxcodegen.split_graph(gm, be.splitting_ops)
    _, stable = cache_factors(be, split_gm, items)
    assert not stable  # keyed by identity: valid in this process only, so never stored
