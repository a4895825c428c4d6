"""fxcodegen in ``TORCH_TRACE`` and ``tlparse``: a real process traced, rendered by the real
``tlparse``, and fxcodegen's artifacts and phases found in the report beside Dynamo's."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import fxcodegen
import pytest
from fxcodegen import torch_trace

TESTS = Path(__file__).resolve().parent
CHILD = TESTS / "_trace_child.py"
PKG_PARENT = Path(fxcodegen.__file__).resolve().parents[1]
PHASES = ("split", "key", "compile_entry", "load_entry", "codegen", "bind", "first_run")


def _tlparse() -> str:
    found = shutil.which("tlparse", path=os.path.dirname(sys.executable)) or shutil.which("tlparse")
    if found is None:
        pytest.fail("tlparse is not installed: it is a dev dependency (make install)")
    return found


def _child(tmp: Path, *ends: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    for name in ("TORCH_TRACE", "TORCH_LOGS", "FXCODEGEN_CACHE_DIR", "FXCODEGEN_REMOTE_CACHE"):
        full.pop(name, None)
    full["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG_PARENT), full.get("PYTHONPATH")]))
    full.update(env)
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp / "cache"), *map(str, ends)],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-4000:]
    return proc


def _artifacts(report: Path) -> dict[str, list[tuple[str, Path]]]:
    """fxcodegen's artifacts in the report by name (number stripped): (compile, path)."""
    out: dict[str, list[tuple[str, Path]]] = {}
    for compile_id, entry in json.loads((report / "compile_directory.json").read_text()).items():
        for art in entry["artifacts"]:
            name = re.sub(r"_\d+\.\w+$", "", art["name"])
            out.setdefault(name, []).append((compile_id, report / art["url"]))
    return out


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_a_traced_run_shows_fxcodegen_in_tlparse(tmp_path: Path) -> None:
    # A cold process stores the program of ranges (1, 16); the traced one loads it without
    # a trace, then misses on ranges (1, 32) and traces and compiles that.
    _child(tmp_path, 16, env={})
    trace = tmp_path / "trace"
    proc = _child(tmp_path, 16, 32, env={"TORCH_TRACE": str(trace), "TORCH_LOGS": "+fxcodegen"})
    assert "OBTAINED 16 loaded without a trace hit" in proc.stdout
    assert "OBTAINED 32 traced and compiled miss" in proc.stdout
    # torch's log format on fxcodegen's INFO lines: TORCH_LOGS turned them on.
    assert re.search(r"^I\d{4} .*fxcodegen/.*graph 0: loaded without a trace", proc.stderr, re.M)

    report = tmp_path / "report"
    logs = list(trace.glob("*.log"))
    assert len(logs) == 1
    subprocess.run(
        [_tlparse(), str(logs[0]), "-o", str(report), "--no-browser", "--overwrite"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    arts = _artifacts(report)

    plans = {_json(p)["obtained"]: (cid, _json(p)) for cid, p in arts["fxcodegen_plan"]}
    assert set(plans) == {"loaded without a trace", "traced and compiled"}
    _, warm = plans["loaded without a trace"]
    assert [e["how"] for p in warm["pieces"] for e in p["entries"]] == [
        "loaded without a trace"
    ] * 2
    cold_cid, cold = plans["traced and compiled"]
    assert [p["splitting"] for p in cold["pieces"]] == [False, True, False]
    assert {(e["entry"], e["how"]) for p in cold["pieces"] for e in p.get("entries", ())} == {
        ("range:1-32", "compiled")
    }
    # The traced graph's artifacts sit in the report beside Dynamo's graph of that compile.
    assert (cold_cid, "dynamo_output_graph") in {
        (cid, name) for name, found in arts.items() for cid, _ in found
    }

    codes = [p.read_text() for _, p in arts["fxcodegen_stitching_code"]]
    assert len(codes) == 2
    for code in codes:
        assert "def execution_fn(" in code and "torch.ops.fxcodegen_toy.attention(" in code

    decisions = {_json(p)["decision"]: _json(p) for _, p in arts["fxcodegen_cache"]}
    assert set(decisions) == {"hit", "miss"}
    assert re.fullmatch(r"[0-9a-f]{64}", decisions["miss"]["key"])
    assert "compile_ranges: [[1, 16]] -> [[1, 32]]" in decisions["miss"]["miss"]
    programs = {_json(p)["decision"]: _json(p) for _, p in arts["fxcodegen_program_cache"]}
    assert set(programs) == {"hit", "miss"}
    assert "compile_ranges: [[1, 16]] -> [[1, 32]]" in programs["miss"]["miss"]

    events = json.loads((report / "chromium_events.json").read_text())
    begun = [e["name"] for e in events if e["ph"] == "B"]
    ended = [e["name"] for e in events if e["ph"] == "E"]
    for name in (f"fxcodegen.{p}" for p in (*PHASES, "load_program", "backend")):
        assert name in begun and begun.count(name) == ended.count(name), name
    assert any(n.startswith("fxcodegen.") for n in begun)
    assert any(not n.startswith("fxcodegen") for n in begun)  # Dynamo's, in the same timeline


def test_payloads_are_built_only_under_a_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._logging._internal import LazyTraceHandler, trace_log

    # As without TORCH_TRACE: only torch's lazy handler, which would write nothing.
    lazy = [h for h in trace_log.handlers if isinstance(h, LazyTraceHandler)]
    monkeypatch.setattr(trace_log, "handlers", lazy)
    built: list[str] = []

    def payload() -> str:
        built.append("x")
        return "text"

    assert not torch_trace.enabled()
    torch_trace.artifact("fxcodegen_test", payload)
    assert built == []

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    keep = Keep()
    monkeypatch.setattr(trace_log, "handlers", [keep])
    assert torch_trace.enabled()
    torch_trace.artifact("fxcodegen_test", payload)
    assert built == ["x"]
    [record] = keep.records
    assert record.metadata["artifact"] == {"name": "fxcodegen_test", "encoding": "string"}
    assert record.payload == "text"


def test_fxcodegen_is_a_torch_log_component() -> None:
    from torch._logging._internal import log_registry

    assert log_registry.log_alias_to_log_qnames.get("fxcodegen") == ["fxcodegen"]
