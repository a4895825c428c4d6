"""``fxcodegen.compile``: a cold process traces once, a warm one loads the traced program
and runs no Dynamo at all; every change the key or the guards see falls back to tracing,
saying why, and never returns a wrong result. Real processes, real Hugging Face models,
Inductor, a real redis-server."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fxcodegen
import pytest
import torch
from _redis_server import RedisServer, serve
from fxcodegen.models import ARCHITECTURES, SDPA, tiny_model

TESTS = Path(__file__).resolve().parent
CHILD = TESTS / "_program_child.py"
PKG_PARENT = Path(fxcodegen.__file__).resolve().parents[1]
RANGES = [[1, 32]]
SIZES = [24, 5, 31]
TOLERANCE = 1e-4
SECRET = "a-shared-secret-for-program-tests"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def run_child(cache_dir: Path, inductor_dir: Path, **over: Any) -> dict[str, Any]:
    cfg = {"cache_dir": str(cache_dir), "ranges": RANGES, "sizes": SIZES, **over}
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG_PARENT), env.get("PYTHONPATH")]))
    for name in ("FXCODEGEN_CACHE_DIR", "FXCODEGEN_PROGRESS", "FXCODEGEN_REMOTE_CACHE"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"no RESULT line:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


@dataclass
class Cold:
    root: Path
    inductor_dir: Path
    cache: Path
    result: dict[str, Any]

    def copy(self, dest: Path) -> Path:
        shutil.copytree(self.cache, dest, symlinks=True)
        return dest


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Cold:
    """One cold process: a tiny Llama traced and compiled into an empty cache."""
    root = tmp_path_factory.mktemp("program")
    result = run_child(root / "cache", root / "inductor")
    return Cold(root, root / "inductor", root / "cache", result)


def _program_files(cache: Path) -> list[Path]:
    out = []
    for factors in cache.glob("*.factors.json"):
        doc = json.loads(factors.read_text())
        if "program_key_version" in doc["factors"].get("extra", {}):
            out.append(cache / factors.name.replace(".factors.json", ".fxc"))
    return out


def _assert_matches_eager(result: dict[str, Any]) -> None:
    assert result["errors"] and max(result["errors"]) < TOLERANCE, result["errors"]


@pytest.mark.slow
def test_cold_process_traces_once_and_stores_the_program(cold: Cold) -> None:
    r = cold.result
    assert r["dynamo_graphs"] == 1  # one trace, none abandoned
    assert [g["cache"] for g in r["graphs"]] == ["miss"]
    assert r["graphs"][0]["obtained"] == "traced and compiled"
    assert r["programs"] == [{"key": r["graphs"][0]["program"], "how": "traced", "results": 1}]
    assert r["counters"]["compile"] >= 2
    assert len(_program_files(cold.cache)) == 1
    assert r["warnings"] == []
    _assert_matches_eager(r)


@pytest.mark.slow
def test_warm_process_captures_no_graph_and_matches_eager(cold: Cold, tmp_path: Path) -> None:
    r = run_child(cold.copy(tmp_path / "cache"), cold.inductor_dir)
    assert r["dynamo_graphs"] == 0
    assert r["counters"].get("compile", 0) == 0
    assert r["graphs"][0]["obtained"] == "loaded without a trace"
    assert r["graphs"][0]["program"] == cold.result["graphs"][0]["program"]
    assert "loaded without a trace (program " in r["graphs"][0]["text"]
    assert r["programs"][0]["how"] == "loaded"
    assert r["warnings"] == []
    _assert_matches_eager(r)


def _tracing_lines(r: dict[str, Any]) -> list[str]:
    return [m for m in r["log"] if m.endswith("tracing") or "; tracing" in m]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"config": {"rms_norm_eps": 1e-3}}, "extra.model.config.rms_norm_eps"),
        ({"dtype": "float64"}, "extra.model.tensors"),
    ],
    ids=["config", "dtype"],
)
def test_changed_model_traces_again_and_says_why(
    cold: Cold, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    r = run_child(cold.copy(tmp_path / "cache"), cold.inductor_dir, **change)
    assert r["dynamo_graphs"] == 1
    assert r["graphs"][0]["obtained"] != "loaded without a trace"
    lines = _tracing_lines(r)
    assert len(lines) == 1 and named in lines[0], r["log"]
    assert r["warnings"] == []
    _assert_matches_eager(r)


@pytest.mark.slow
def test_damaged_program_is_traced_again_and_replaced(cold: Cold, tmp_path: Path) -> None:
    cache = cold.copy(tmp_path / "cache")
    (path,) = _program_files(cache)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    r = run_child(cache, cold.inductor_dir)
    assert len(r["warnings"]) == 1 and path.name[:16] in r["warnings"][0], r["log"]
    assert r["dynamo_graphs"] == 1
    _assert_matches_eager(r)
    again = run_child(cache, cold.inductor_dir)
    assert again["dynamo_graphs"] == 0 and again["warnings"] == []
    _assert_matches_eager(again)


@pytest.mark.slow
def test_a_call_the_guards_reject_is_traced_and_stored(cold: Cold, tmp_path: Path) -> None:
    cache = cold.copy(tmp_path / "cache")
    # One token: Dynamo specialises sizes 0 and 1, so the stored guards reject it.
    r = run_child(cache, cold.inductor_dir, sizes=[24, 1])
    assert r["dynamo_graphs"] == 1
    assert any("its guards reject this call" in m for m in r["log"]), r["log"]
    assert r["programs"][0]["results"] == 2
    assert max(r["errors"]) < TOLERANCE
    again = run_child(cache, cold.inductor_dir, sizes=[1, 24])
    assert again["dynamo_graphs"] == 0 and again["warnings"] == []
    assert max(again["errors"]) < TOLERANCE


NETMOD = """
import torch
import helpers

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(helpers.act(self.a(x))))
"""


@pytest.mark.slow
def test_a_changed_source_outside_the_key_is_traced_again(tmp_path: Path) -> None:
    """``helpers.py`` is not a module class's file, so it is not in the key: the load
    notices that the traced source changed, and the new code runs."""
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "netmod.py").write_text(NETMOD)
    (mod / "helpers.py").write_text("import torch\n\ndef act(x):\n    return torch.tanh(x)\n")
    cache, inductor = tmp_path / "cache", tmp_path / "inductor"
    first = run_child(cache, inductor, module_dir=str(mod), sizes=[6, 3])
    assert first["dynamo_graphs"] == 1 and max(first["errors"]) < TOLERANCE
    warm = run_child(cache, inductor, module_dir=str(mod), sizes=[6, 3])
    assert warm["dynamo_graphs"] == 0 and max(warm["errors"]) < TOLERANCE
    (mod / "helpers.py").write_text("import torch\n\ndef act(x):\n    return torch.sin(x) * 3\n")
    changed = run_child(cache, inductor, module_dir=str(mod), sizes=[6, 3])
    assert changed["dynamo_graphs"] == 1
    assert any("the source of helpers" in m for m in changed["log"]), changed["log"]
    assert max(changed["errors"]) < TOLERANCE  # against the new code's eager output


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from serve(tmp_path)


@pytest.mark.slow
def test_warm_start_from_redis_alone_runs_no_dynamo(
    cold: Cold, redis_server: RedisServer, tmp_path: Path
) -> None:
    remote = {"remote_cache": redis_server.url, "cache_secret": SECRET}
    first = run_child(cold.copy(tmp_path / "first"), cold.inductor_dir, **remote)
    assert first["dynamo_graphs"] == 0  # from the local copy; publishes what it loaded
    fresh = run_child(tmp_path / "empty", cold.inductor_dir, **remote)
    assert fresh["dynamo_graphs"] == 0, fresh["log"]
    assert fresh["counters"].get("compile", 0) == 0
    assert fresh["warnings"] == []
    _assert_matches_eager(fresh)


# --------------------------------------------------------------------------------------
# In process, with the eager compiler (no cache): one trace, and the fallbacks


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_no_trace_is_abandoned(arch: str) -> None:
    torch._dynamo.utils.counters.clear()
    model = tiny_model(arch, num_layers=1)
    compiled = fxcodegen.compile(model, splitting_ops=[SDPA], compiler="eager", cache_dir=False)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = compiled(input_ids=ids).last_hidden_state
        want = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, want)
    assert [g.cache for g in compiled.graphs] == ["bypassed"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


class _Breaks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        print("", end="")  # a graph break
        return torch.relu(y)


def test_a_model_with_a_graph_break_runs_through_torch_compile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _Breaks()
    compiled = fxcodegen.compile(model, splitting_ops=["torch.relu"], compiler="eager")
    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="fxcodegen"):
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x * 2), model(x * 2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    captured = [w for w in warnings if "cannot be captured as one graph" in w]
    assert len(captured) == 1, warnings


def test_compile_takes_backend_options_and_checks_them() -> None:
    with pytest.raises(ValueError, match="unknown compiler"):
        fxcodegen.compile(torch.nn.Linear(2, 2), splitting_ops=[SDPA], compiler="nope")
    with pytest.raises(TypeError, match="nn.Module"):
        fxcodegen.compile(lambda x: x, splitting_ops=[SDPA])  # type: ignore[arg-type]


def test_a_loaded_program_outside_compile_is_refused() -> None:
    from fxcodegen.program import StitchedGraph

    with pytest.raises(RuntimeError, match="fxcodegen.compile"):
        StitchedGraph.deserialize_compile_artifacts(b'{"graph": "' + b"0" * 64 + b'"}')


def test_the_build_in_the_key_leaves_out_the_demo_and_the_benches() -> None:
    from fxcodegen.cache.keys import build_files

    files = build_files(PKG_PARENT / "fxcodegen")
    for shaping in ("piecewise.py", "program.py", "split.py", "cache/format.py"):
        assert shaping in files
    assert not [f for f in files if f in ("demo.py", "cli.py", "models.py", "toy.py")]
    assert not [f for f in files if f.startswith("bench/")]
    assert any(f.startswith("_core") for f in files)
