"""Cooperative cold start through the backend, with Inductor and real processes: processes
sharing a cache directory, "machines" sharing a real redis-server, and the faults (Redis
unreachable, killed mid cold start, values altered in Redis, a claimer killed mid-compile).

Like ``test_cache_backend.py``, the children share one Inductor cache directory warmed by a
first cold child, so each compile is an Inductor FX-graph-cache hit (seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _redis_server import RedisServer, free_port, serve
from fxcodegen import cache_cli
from fxcodegen.cache import Cache
from fxcodegen.cache.remote import PREFIX
from test_cache_backend import (
    CHILD,
    DISTINCT_ENTRIES,
    Shared,
    _build_hash,
    _child_env,
    _config,
    _outputs,
    _parse,
    _skip_if_rebuilt,
    run_child,
)
from test_cache_backend import shared as shared  # noqa: F401 - the module fixture

SECRET = "a-shared-secret-for-tests"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from serve(tmp_path)


def _remote(server: RedisServer, **over: Any) -> dict[str, Any]:
    return {"remote_cache": server.url, "cache_secret": SECRET, **over}


def _spawn(cache_dir: Path, inductor_dir: Path, **over: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), _config(cache_dir, **over)],
        env=_child_env(inductor_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=600)
    return _parse(out, err, p.returncode)


def _together(tmp_path: Path, inductor_dir: Path, runs: list[tuple[Path, dict[str, Any]]]):
    go = tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(len(runs))]
    procs = [
        _spawn(d, inductor_dir, ready=str(r), go=str(go), **over)
        for (d, over), r in zip(runs, readies, strict=True)
    ]
    try:
        deadline = time.monotonic() + 300
        while not all(r.exists() for r in readies):
            assert time.monotonic() < deadline, "children did not get ready"
            assert all(p.poll() is None for p in procs), "a child exited early"
            time.sleep(0.05)
        go.write_text("go")
        return [_finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)


def _compiles(r: dict[str, Any]) -> int:
    return int(r["counters"].get("compile", 0))


def _check_correct(results: list[dict[str, Any]], shared: Shared) -> None:
    for r in results:
        assert all(o["max_err_vs_eager"] < 1e-4 for o in r["outputs"])
        assert _outputs(r) == _outputs(shared.cold)  # bit-identical to a lone cold start
        (g,) = r["graphs"]
        assert g["key"] == shared.cold["graphs"][0]["key"]
        # every distinct piece-entry was compiled here or loaded from another process
        assert g["compiled"] + g["loaded"] == DISTINCT_ENTRIES, r["log"]


def _wait_for_key(server: RedisServer, pattern: str, p: subprocess.Popen[str]) -> None:
    r = server.client()
    deadline = time.monotonic() + 300
    while not r.keys(pattern):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, f"no {pattern} in Redis"
        time.sleep(0.02)


def test_processes_sharing_a_directory_compile_each_entry_once(
    shared: Shared, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "shared-cache"
    results = _together(tmp_path, shared.inductor_dir, [(cache_dir, {}), (cache_dir, {})])
    _skip_if_rebuilt(shared.build)
    assert sum(_compiles(r) for r in results) == DISTINCT_ENTRIES, [r["log"] for r in results]
    _check_correct(results, shared)
    assert all(r["warnings"] == [] for r in results)
    assert Cache(cache_dir).verify() == []


def test_machines_sharing_redis_then_an_empty_disk_compiles_nothing(
    shared: Shared,
    tmp_path: Path,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    remote = _remote(redis_server)
    results = _together(
        tmp_path,
        shared.inductor_dir,
        [(tmp_path / "m1", remote), (tmp_path / "m2", remote)],
    )
    _skip_if_rebuilt(shared.build)
    assert sum(_compiles(r) for r in results) == DISTINCT_ENTRIES, [r["log"] for r in results]
    _check_correct(results, shared)
    assert all(r["warnings"] == [] for r in results)
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0

    # a third replica with an empty disk (and an empty Inductor cache) compiles nothing
    third = run_child(tmp_path / "m3", tmp_path / "empty-inductor", **remote)
    _skip_if_rebuilt(shared.build)
    (g,) = third["graphs"]
    assert g["cache"] == "hit" and _compiles(third) == 0, third["log"]
    assert third["counters"]["remote_loaded"] == 1  # the artifact, with its blobs
    assert _outputs(third) == _outputs(shared.cold)
    assert third["warnings"] == []

    # a value truncated and one replaced in Redis: not used, recompiled, replaced
    r = redis_server.client()
    (art,) = r.keys(f"{PREFIX}*:art:*")
    r.set(art, r.get(art)[:-100])
    blobs = sorted(r.keys(f"{PREFIX}*:blob:*"))
    r.set(blobs[0], r.get(blobs[1]))  # a valid value of another key
    fourth = run_child(tmp_path / "m4", shared.inductor_dir, **remote)
    _skip_if_rebuilt(shared.build)
    (g,) = fourth["graphs"]
    assert g["cache"] == "miss"
    assert _compiles(fourth) == 1, fourth["log"]  # the entry whose blob was replaced
    assert g["loaded"] == DISTINCT_ENTRIES - 1
    bad = [w for w in fourth["warnings"] if "bad signature" in w]
    assert len(bad) == 2 and len(fourth["warnings"]) == 2, fourth["warnings"]
    assert _outputs(fourth) == _outputs(shared.cold)
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0  # replaced


def test_redis_unreachable_at_start(shared: Shared, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    r = run_child(tmp_path / "c", shared.inductor_dir, remote_cache=url, cache_secret=SECRET)
    _skip_if_rebuilt(shared.build)
    assert _compiles(r) == DISTINCT_ENTRIES
    _check_correct([r], shared)
    (w,) = r["warnings"]
    assert "remote store" in w and "going on with the local cache only" in w


def test_redis_killed_mid_cold_start(
    shared: Shared, tmp_path: Path, redis_server: RedisServer
) -> None:
    p = _spawn(tmp_path / "c", shared.inductor_dir, **_remote(redis_server))
    try:
        _wait_for_key(redis_server, f"{PREFIX}*:entry:*", p)
        assert p.poll() is None
        redis_server.kill()
        r = _finish(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    _skip_if_rebuilt(shared.build)
    assert _compiles(r) == DISTINCT_ENTRIES
    _check_correct([r], shared)
    (w,) = r["warnings"]  # once, however many calls failed after it
    assert "going on with the local cache only" in w, r["warnings"]


def test_claimer_killed_mid_compile(
    shared: Shared, tmp_path: Path, redis_server: RedisServer
) -> None:
    remote = _remote(redis_server, claim_ttl=2)
    victim = _spawn(tmp_path / "victim", shared.inductor_dir, **remote)
    try:
        _wait_for_key(redis_server, f"{PREFIX}*:claim:*", victim)
        os.kill(victim.pid, signal.SIGKILL)  # dies holding a claim, mid-compile
    finally:
        victim.kill()
        victim.communicate(timeout=30)
    stored = len(redis_server.client().keys(f"{PREFIX}*:entry:*"))
    build = _build_hash()
    r = run_child(tmp_path / "survivor", shared.inductor_dir, **remote)
    _skip_if_rebuilt(build)
    assert _compiles(r) == DISTINCT_ENTRIES - stored
    _check_correct([r], shared)
    assert r["warnings"] == []
    assert json.loads(json.dumps(r["counters"])).get("remote_loaded", 0) == stored
