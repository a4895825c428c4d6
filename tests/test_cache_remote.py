"""The remote store (a real redis-server per test) and cooperative compile between real
processes, without Inductor: signatures, faults (unreachable, slow, killed, altered values,
dead claimers), the tools, and how processes split a set of entries."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fxcodegen
import pytest
from _redis_server import RedisServer, free_port, serve
from fxcodegen import cache_cli
from fxcodegen.cache import Artifact, Cache, PieceRecord
from fxcodegen.cache.coop import Coop, clear_entries
from fxcodegen.cache.remote import RemoteStore, open_remote, sign, unsign

TESTS = Path(__file__).resolve().parent
COOP_CHILD = TESTS / "_coop_child.py"
PKG_PARENT = Path(fxcodegen.__file__).resolve().parents[1]
SECRET = "a-shared-secret-for-tests"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from serve(tmp_path)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------------------
# Signatures


def test_signatures_bind_secret_key_and_payload() -> None:
    s = b"secret"
    value = sign(s, "fxcg:v1:art:aa", b"payload")
    assert unsign(s, "fxcg:v1:art:aa", value) == b"payload"
    assert unsign(b"other", "fxcg:v1:art:aa", value) is None  # another secret
    assert unsign(s, "fxcg:v1:art:bb", value) is None  # moved under another key
    assert unsign(s, "fxcg:v1:art:aa", value[:-1]) is None  # truncated
    assert unsign(s, "fxcg:v1:art:aa", value[:20]) is None  # truncated into the MAC
    flipped = bytearray(value)
    flipped[-1] ^= 1
    assert unsign(s, "fxcg:v1:art:aa", bytes(flipped)) is None
    assert unsign(s, "fxcg:v1:art:aa", b"payload") is None  # unsigned
    assert unsign(s, "fxcg:v1:art:aa", b"") is None


def test_no_secret_means_no_remote_store(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.delenv("FXCODEGEN_CACHE_SECRET", raising=False)
    monkeypatch.delenv("FXCODEGEN_REMOTE_CACHE", raising=False)
    url = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, "fxcodegen"):
        assert open_remote(url) is None
        be = fxcodegen.backend(splitting_ops=["aten::mm"], cache_dir=tmp_path, remote_cache=url)
    assert be.coop is not None and be.coop.remote is None
    (w1, w2) = _warnings(caplog)
    assert "no shared secret" in w1 and "FXCODEGEN_CACHE_SECRET" in w1 and w1 == w2
    # the environment variables are read too
    monkeypatch.setenv("FXCODEGEN_REMOTE_CACHE", url)
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    be = fxcodegen.backend(splitting_ops=["aten::mm"], cache_dir=tmp_path)
    assert isinstance(be.coop.remote, RemoteStore) and be.coop.remote.url == url
    with pytest.raises(ValueError, match="redis:// URL"):
        open_remote("http://example.invalid/", SECRET)
    with pytest.raises(ValueError, match="remote_timeout"):
        open_remote(url, SECRET, timeout=0)


# --------------------------------------------------------------------------------------
# A real server


def _tiny_artifact(cache: Cache, tag: str) -> str:
    """Store a small artifact (no torch objects) in ``cache``; its key."""
    key = hashlib.sha256(tag.encode()).hexdigest()
    art = Artifact(
        code="def execution_fn(x):\n    return x\n",
        submod_names=[],
        consts=[1, 2],
        pieces=[PieceRecord("submod_0", {"range:1-8": tag.encode() * 40, "size:4": b"s" * 99})],
    )
    factors = {"tag": tag}
    assert cache.store(key, factors, art.prepare(key, factors)) is not None
    return key


def test_publish_fill_and_tampering(
    redis_server: RedisServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    a, b = Cache(tmp_path / "a"), Cache(tmp_path / "b")
    ra = RemoteStore(redis_server.url, SECRET.encode())
    key = _tiny_artifact(a, "one")
    assert Coop(a, ra).publish(key)
    assert not Coop(a, ra).publish(key)  # already there
    r = redis_server.client()
    names = sorted(n.decode() for n in r.keys("*"))
    assert [n.split(":")[3] for n in names] == ["art", "blob", "blob"]
    assert all(r.get(n).startswith(b"FXCGSIG1") for n in names)  # signed
    # nothing names a path or a host
    assert all(str(tmp_path) not in n for n in names)

    # an empty directory warm-starts from the remote store alone
    rb = RemoteStore(redis_server.url, SECRET.encode())
    assert Coop(b, rb).fill(key)
    assert b.load(key).pieces[0].entries == a.load(key).pieces[0].entries
    assert b.verify() == []

    # a value truncated or replaced in Redis: not used, logged once, then replaced
    art_name = ra.name("art", key)
    r.set(art_name, r.get(art_name)[:-10])
    c = Cache(tmp_path / "c")
    rc = RemoteStore(redis_server.url, SECRET.encode())
    with caplog.at_level(logging.INFO, "fxcodegen"):
        assert not Coop(c, rc).fill(key)
        assert not Coop(c, rc).fill(key)
    bad = [m for m in _warnings(caplog) if "bad signature" in m]
    assert len(bad) == 1, _warnings(caplog)
    assert not c.artifact_path(key).exists()
    blob_name = next(n for n in names if ":blob:" in n)
    other = sign(SECRET.encode(), ra.name("blob", "0" * 64), b"hostile")
    r.set(blob_name, other)  # validly signed, but for another key
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 1
    # the process that found them bad writes them again
    c.store(key, {"tag": "one"}, a.load(key))
    assert rc.get("blob", blob_name.rsplit(":", 1)[1]) is None
    assert Coop(c, rc).publish(key, force=True)
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0


def test_cli_remote_ls_verify_clear(
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    cache = Cache(tmp_path / "c")
    key = _tiny_artifact(cache, "two")
    assert Coop(cache, RemoteStore(redis_server.url, SECRET.encode())).publish(key)
    assert cache_cli.main(["ls", "--remote", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert key[:16] in out and "1 artifact(s)" in out and "pieces=1 entries=2" in out
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0
    assert "0 object(s) with problems" in capsys.readouterr().out
    # another secret has its own namespace: it sees none of these, and says so
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", "another secret, as long")
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert "0 object(s), 0 object(s) with problems" in out
    assert "3 object(s) signed with other secrets (not checked)" in out
    monkeypatch.delenv("FXCODEGEN_CACHE_SECRET")
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 2
    assert "FXCODEGEN_CACHE_SECRET" in capsys.readouterr().err
    assert cache_cli.main(["clear", "--remote", redis_server.url]) == 0
    assert "removed 3" in capsys.readouterr().out
    assert redis_server.client().dbsize() == 0
    assert cache_cli.main(["ls", "--remote", f"redis://127.0.0.1:{free_port()}/0"]) == 2


# --------------------------------------------------------------------------------------
# Faults


def test_unreachable_at_start_is_bounded_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    store = RemoteStore(url, SECRET.encode(), timeout=0.5)
    coop = Coop(Cache(tmp_path / "c"), store)
    key = "ab" * 32
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, "fxcodegen"):
        assert not coop.fill(key)
        assert coop.get_entry(key) is None
        coop.put_entry(key, b"data")
        with coop.claim(key) as held:
            assert held  # the local claim alone
    assert time.monotonic() - t0 < 5
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "going on with the local cache" in warnings[0], warnings
    assert store.down is not None
    assert coop.get_entry(key) == b"data"  # the local level still works


def test_slow_redis_times_out(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RemoteStore(redis_server.url, SECRET.encode(), timeout=0.5)
    coop = Coop(Cache(tmp_path / "c"), store)
    assert store.available()
    redis_server.pause()  # accepts connections, answers nothing
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, "fxcodegen"):
            assert coop.get_entry("cd" * 32) is None
            assert not coop.fill("cd" * 32)
        took = time.monotonic() - t0
    finally:
        redis_server.resume()
    assert took < 3, took  # one timeout, then the store is off
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "Timeout" in warnings[0], warnings


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Polls ``condition()`` until it is true; fails naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        time.sleep(0.01)


def test_claims_expire_renew_and_release(redis_server: RedisServer) -> None:
    r = redis_server.client()
    a = RemoteStore(redis_server.url, SECRET.encode(), claim_ttl=3.0)
    b = RemoteStore(redis_server.url, SECRET.encode(), claim_ttl=3.0)
    key = "ef" * 32
    name = a.name("claim", key)
    claim = a.claim(key)
    assert claim not in (None, False)
    token = r.get(name)
    assert token == claim.token.encode()
    # Held with the TTL; the server cannot expire it while it is persisted, so the checks
    # below race nothing.
    assert 0 < r.pttl(name) <= 3000
    assert r.persist(name)
    assert b.claim(key) is False
    # The holder renews it: its thread puts the TTL back on (same token, not a new claim).
    _until(lambda: r.pttl(name) > 0, "the claim was not renewed")
    assert r.pttl(name) <= 3000 and r.get(name) == token
    claim.release()
    assert r.exists(name) == 0  # released at once, not left to expire
    again = b.claim(key)
    assert again not in (None, False)
    assert a.claim(key) is False
    again.release()

    # A claimer that stopped renewing (it renews only every 20 minutes): its claim expires
    # through the server's own TTL, made to run out now, and the entry is free.
    stalled = RemoteStore(redis_server.url, SECRET.encode(), claim_ttl=3600.0)
    stale = stalled.claim(key)
    assert stale not in (None, False)
    assert 3_000_000 < r.pttl(name) <= 3_600_000
    assert b.claim(key) is False
    assert r.pexpire(name, 1)
    _until(lambda: r.exists(name) == 0, "the claim did not expire")
    taken = b.claim(key)
    assert taken not in (None, False)
    holder = r.get(name)
    assert holder == taken.token.encode() != stale.token.encode()
    stale.release()  # too late: compare-and-delete leaves the new holder's claim
    assert r.get(name) == holder
    taken.release()
    assert r.keys("*") == []  # released claims leave nothing
    # a claimer that dies: test_claimer_killed_mid_compile_is_taken_over[redis-claim]


# --------------------------------------------------------------------------------------
# Cooperating processes (stand-in compiles)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PKG_PARENT), env.get("PYTHONPATH")]))
    return env


def _spawn(**cfg: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(COOP_CHILD), json.dumps(cfg)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _wait_for(paths: list[Path], procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, "children did not get ready"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)


def _run_together(tmp_path: Path, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    go = tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(len(configs))]
    procs = [_spawn(**c, ready=str(r), go=str(go)) for c, r in zip(configs, readies, strict=True)]
    try:
        _wait_for(readies, procs)
        go.write_text("go")
        return [_result(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)


N = 6


def _check_split(results: list[dict[str, Any]]) -> None:
    import _coop_child

    expected = {
        _coop_child.entry_key(i): hashlib.sha256(_coop_child.entry_bytes(i)).hexdigest()
        for i in range(N)
    }
    compiled = [k for r in results for k in r["mine"]]
    assert sorted(compiled) == sorted(expected)  # each entry compiled exactly once
    for r in results:
        assert r["sha"] == expected  # every process has every entry, intact
        assert r["counters"].get("compile", 0) == len(r["mine"])
        assert r["warnings"] == []


def test_processes_sharing_a_directory_split_the_entries(tmp_path: Path) -> None:
    cfg = {"cache_dir": str(tmp_path / "shared"), "n": N, "compile_s": 0.4}
    results = _run_together(tmp_path, [cfg, cfg])
    _check_split(results)


def test_machines_sharing_redis_split_the_entries(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    base = {"n": N, "compile_s": 0.4, "remote": redis_server.url, "secret": SECRET}
    results = _run_together(
        tmp_path,
        [{**base, "cache_dir": str(tmp_path / "m1")}, {**base, "cache_dir": str(tmp_path / "m2")}],
    )
    _check_split(results)
    for r in results:
        assert r["counters"].get("remote_loaded", 0) == len(r["others"])
        assert r["counters"].get("remote_stored", 0) == len(r["mine"])
    third = _result(_spawn(**base, cache_dir=str(tmp_path / "m3")))
    assert third["mine"] == [] and third["counters"].get("compile", 0) == 0
    assert third["counters"]["remote_loaded"] == N


@pytest.mark.parametrize("remote", [False, True], ids=["local-lock", "redis-claim"])
def test_claimer_killed_mid_compile_is_taken_over(
    redis_server: RedisServer, tmp_path: Path, remote: bool
) -> None:
    base: dict[str, Any] = {"n": N, "compile_s": 0.05}
    if remote:
        base.update(remote=redis_server.url, secret=SECRET, claim_ttl=1.0)
    ready = tmp_path / "holder-ready"
    holder_dir = tmp_path / ("holder" if remote else "shared")
    holder = _spawn(**base, cache_dir=str(holder_dir), hold=3, ready=str(ready))
    try:
        _wait_for([ready], [holder])
        os.kill(holder.pid, signal.SIGKILL)  # dies holding three claims
    finally:
        holder.kill()
        holder.communicate(timeout=30)
    t0 = time.monotonic()
    r = _result(_spawn(**base, cache_dir=str(tmp_path / "shared")))
    assert sorted(r["mine"]) == sorted(r["sha"]) and len(r["mine"]) == N
    assert r["warnings"] == []
    # a local lock is free at once; a Redis claim after its TTL
    assert time.monotonic() - t0 < 60


def test_a_claim_never_released_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    import _coop_child

    cache = Cache(tmp_path / "shared")
    assert cache.usable()
    held = _coop_child.entry_key(2)
    with cache.locked(held):  # a live process that never finishes its compile
        r = _result(
            _spawn(cache_dir=str(cache.root), n=N, compile_s=0.01, wait_s=1.5),
        )
    assert len(r["mine"]) == N  # compiled it itself after waiting
    assert any("did not arrive within 2s" in w for w in r["warnings"]), r["warnings"]
    assert clear_entries(cache.root) == N
