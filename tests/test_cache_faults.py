"""Faults of the cache layer an attacker or an unlucky operator meets: a Redis that drips
or answers nonsense (a fake RESP server), secrets that are not secrets, ``cache clear`` on
the wrong directory, damaged or foreign objects in a real redis-server shared by real
processes, claims never released or held by a frozen process, hostile file names, and bad
arguments. No Inductor."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _coop_child
import fxcodegen
import pytest
from _fake_redis import FakeRedis, drip, slow, wrong_types
from _redis_server import RedisServer, free_port, serve
from fxcodegen import cache_cli
from fxcodegen.cache import Cache, CacheError
from fxcodegen.cache.coop import Coop, Work
from fxcodegen.cache.remote import RemoteStore, open_remote
from test_cache_remote import SECRET, _env, _result, _spawn, _tiny_artifact, _wait_for

N = 6


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from serve(tmp_path)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """fxcodegen's warnings (not redis-py's own about the fake server's protocol)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "fxcodegen"
    ]


def _work(n: int, start: int = 0) -> list[Work]:
    return [
        Work(_coop_child.entry_key(i), f"entry {i}", lambda i=i: _coop_child.entry_bytes(i))
        for i in range(start, start + n)
    ]


# --------------------------------------------------------------------------------------
# 1. A server that answers slowly but steadily


def test_a_dripping_reply_is_cut_at_the_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeRedis(drip()) as fake:
        store = RemoteStore(fake.url, SECRET.encode(), timeout=0.5)
        coop = Coop(Cache(tmp_path / "c"), store)
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, "fxcodegen"):
            assert coop.get_entry("ab" * 32) is None
            assert not coop.fill("ab" * 32)
        assert time.monotonic() - t0 < 1.5
        (w,) = _warnings(caplog)
        assert "RemoteTimeout" in w and "GET within 0.5s" in w, w
        # the tools too: one line, exit status 2
        t0 = time.monotonic()
        assert cache_cli.main(["ls", "--remote", fake.url, "--timeout", "0.5"]) == 2
        assert time.monotonic() - t0 < 1.5
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "RemoteTimeout" in err, err


def test_a_server_slow_on_every_call_is_dropped_within_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeRedis(slow(0.15)) as fake:
        store = RemoteStore(fake.url, SECRET.encode(), timeout=0.5, budget=1.0)
        coop = Coop(Cache(tmp_path / "c"), store, poll_s=0.01)
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, "fxcodegen"):
            others, mine = coop.gather(_work(N))
        took = time.monotonic() - t0
    assert others == {} and len(mine) == N  # compiled here, correctly
    assert took < 1.8, took  # each call was inside the deadline; together they were not
    (w,) = _warnings(caplog)
    assert "budget 1s" in w and "going on with the local cache only" in w, w
    assert store.down is not None
    # by default the budget is 15 times the timeout
    assert RemoteStore(fake.url, SECRET.encode(), timeout=0.4).budget == pytest.approx(6.0)


# --------------------------------------------------------------------------------------
# 2. Secrets that are not secrets


@pytest.mark.parametrize(
    ("secret", "error", "match"),
    [
        (5, TypeError, "cache_secret must be str or bytes, got int"),
        (True, TypeError, "cache_secret must be str or bytes, got bool"),
        (bytearray(b"x" * 32), TypeError, "cache_secret must be str or bytes"),
        (b"\0", ValueError, "cache_secret is too short"),
        ("x", ValueError, "cache_secret is too short"),
        ("", ValueError, "cache_secret is too short"),
        (b"\0" * 32, ValueError, "cache_secret is all zero bytes"),
    ],
)
def test_weak_secrets_are_refused(secret: Any, error: type, match: str, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(error, match=match):
        open_remote(url, secret)
    with pytest.raises(error, match=match):  # with or without a URL
        fxcodegen.backend(splitting_ops=["aten::mm"], cache_dir=tmp_path, cache_secret=secret)


def test_a_weak_secret_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", "short")
    with pytest.raises(ValueError, match="FXCODEGEN_CACHE_SECRET is too short"):
        open_remote(url)
    assert cache_cli.main(["verify", "--remote", url]) == 2
    assert "FXCODEGEN_CACHE_SECRET is too short" in capsys.readouterr().err
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", "a" * 16)
    assert open_remote(url) is not None  # 16 bytes is enough


# --------------------------------------------------------------------------------------
# 3. `cache clear` on a directory that is not a cache


def test_clear_refuses_a_directory_that_is_not_a_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "project"
    for sub in ("blobs", "locks", "entries"):
        (project / sub).mkdir(parents=True)
    names = ["todo.txt", "paper.fxc", ".tmp-draft", "blobs/photo.jpg", "locks/deploy.lock"]
    names.append("entries/" + "a" * 64)
    for name in names:
        (project / name).write_text("mine")
    assert cache_cli.main(["clear", str(project)]) == 2
    assert "not an fxcodegen cache" in capsys.readouterr().err
    assert all((project / n).read_text() == "mine" for n in names)
    with pytest.raises(CacheError, match="not an fxcodegen cache"):
        Cache(project).clear()
    assert cache_cli.main(["clear", ""]) == 2  # not the current directory
    assert "cache_dir must not be empty" in capsys.readouterr().err


def test_clear_removes_only_the_caches_own_files(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    key = _tiny_artifact(cache, "one")
    coop = Coop(cache)
    coop.put_entry("e" * 64, b"entry")
    foreign = ["notes.txt", "paper.fxc", ".tmp-draft", "blobs/photo.jpg", "locks/deploy.lock"]
    foreign += ["entries/readme", f"{key[::-1]}.fxc.bak"]
    for name in foreign:
        (cache.root / name).write_text("mine")
    (cache.root / f"{'d' * 64}.fxc").mkdir()  # a directory under an artifact's name
    with cache.locked(key):
        pass
    assert cache.clear() == 7  # artifact, factors, 3 blobs, the lock, the entry reference
    assert all((cache.root / n).read_text() == "mine" for n in foreign)
    assert (cache.root / f"{'d' * 64}.fxc").is_dir()
    assert not cache.artifact_path(key).exists() and coop.get_entry("e" * 64) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="making a link owned by another user needs root")
def test_clear_refuses_another_users_link(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    _tiny_artifact(cache, "one")
    link = tmp_path / "link"
    link.symlink_to(cache.root)
    os.lchown(link, 4321, 4321)
    with pytest.raises(CacheError, match="symbolic link owned by another user"):
        Cache(link).clear()
    assert len(cache.keys()) == 1


# --------------------------------------------------------------------------------------
# 4 and 7. Damaged objects are repaired; another secret's objects are left alone


def _flip_every_value(server: RedisServer) -> int:
    r = server.client()
    names = r.keys("*")
    for name in names:
        value = bytearray(r.get(name))
        value[len(value) // 2] ^= 0x40
        r.set(name, bytes(value))
    return len(names)


def test_damaged_remote_entries_and_blobs_are_repaired(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {"n": N, "compile_s": 0.0, "remote": redis_server.url, "secret": SECRET}
    first = _result(_spawn(**base, cache_dir=str(tmp_path / "m1")))
    assert len(first["mine"]) == N
    assert _flip_every_value(redis_server) == 2 * N  # N entry references, N blobs
    second = _result(_spawn(**base, cache_dir=str(tmp_path / "m2")))
    assert len(second["mine"]) == N
    assert sum("bad signature" in w for w in second["warnings"]) == N, second["warnings"]
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0
    third = _result(_spawn(**base, cache_dir=str(tmp_path / "m3")))
    assert third["mine"] == [] and third["warnings"] == []
    assert third["counters"]["remote_loaded"] == N


def test_damaged_remote_artifact_and_blobs_are_republished(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Cache(tmp_path / "a")
    key = _tiny_artifact(a, "one")
    assert Coop(a, RemoteStore(redis_server.url, SECRET.encode())).publish(key)
    assert _flip_every_value(redis_server) == 3  # the artifact and its two blobs
    b = Cache(tmp_path / "b")
    rb = RemoteStore(redis_server.url, SECRET.encode())
    assert not Coop(b, rb).fill(key)  # bad signature: compile (here: store) afresh
    assert b.store(key, {"tag": "one"}, a.load(key)) is not None
    assert Coop(b, rb).publish(key, force=True)
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    assert cache_cli.main(["verify", "--remote", redis_server.url]) == 0
    assert Coop(Cache(tmp_path / "c"), RemoteStore(redis_server.url, SECRET.encode())).fill(key)


def test_a_replica_with_another_secret_overwrites_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    base = {"n": N, "compile_s": 0.0, "remote": redis_server.url}
    first = _result(_spawn(**base, secret=SECRET, cache_dir=str(tmp_path / "m1")))
    before = {n: redis_server.client().get(n) for n in redis_server.client().keys("*")}
    assert len(before) == 2 * N and len(first["mine"]) == N
    other = _result(
        _spawn(**base, secret="another secret, 32 bytes long...", cache_dir=str(tmp_path / "w"))
    )
    assert len(other["mine"]) == N and other["warnings"] == []  # it sees none of them
    r = redis_server.client()
    assert all(r.get(n) == v for n, v in before.items())
    third = _result(_spawn(**base, secret=SECRET, cache_dir=str(tmp_path / "m3")))
    assert third["mine"] == [] and third["warnings"] == []


# --------------------------------------------------------------------------------------
# 5 and 6. Claims never released: one deadline per cold start, and who holds them


@contextlib.contextmanager
def _holder(tmp_path: Path, hold: int) -> Iterator[subprocess.Popen[str]]:
    """A process holding the local claims of entries ``0 .. hold-1`` until killed."""
    ready = tmp_path / "holder-ready"
    p = _spawn(cache_dir=str(tmp_path / "shared"), n=N, compile_s=0.0, hold=hold, ready=str(ready))
    try:
        _wait_for([ready], [p])
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.communicate(timeout=30)


def test_claim_wait_is_one_deadline_for_the_whole_cold_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _holder(tmp_path, hold=N):
        coop = Coop(Cache(tmp_path / "shared"), wait_s=1.0, poll_s=0.02)
        with caplog.at_level(logging.INFO, "fxcodegen"):
            t0 = time.monotonic()
            _, mine_a = coop.gather(_work(3))  # graph A: waits the whole second
            t1 = time.monotonic()
            _, mine_b = coop.gather(_work(3, start=3))  # graph B: the wait is spent
            t2 = time.monotonic()
    assert len(mine_a) == len(mine_b) == 3
    assert 0.9 < t1 - t0 < 2.0 and t2 - t1 < 0.3, (t1 - t0, t2 - t1)
    gave_up = [w for w in _warnings(caplog) if "did not arrive" in w]
    assert len(gave_up) == 1 and "claim_wait" in gave_up[0], _warnings(caplog)
    be = fxcodegen.backend(splitting_ops=["aten::mm"], cache_dir=tmp_path / "b", claim_wait=7)
    assert be.coop.wait_s == 7


def test_a_frozen_claimer_is_named_while_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _holder(tmp_path, hold=2) as holder:
        os.kill(holder.pid, signal.SIGSTOP)
        coop = Coop(Cache(tmp_path / "shared"), wait_s=1.0, poll_s=0.02, warn_s=0.3)
        with caplog.at_level(logging.INFO, "fxcodegen"):
            _, mine = coop.gather(_work(N))
    assert len(mine) == N
    warnings = _warnings(caplog)
    waiting = [w for w in warnings if w.startswith("fxcodegen cache: waited")]
    assert len(waiting) == 1, warnings  # then INFO, not a warning every 0.3 s
    assert f"pid {holder.pid} (stopped)" in waiting[0] and "entry 0" in waiting[0], waiting


# --------------------------------------------------------------------------------------
# 8 and 9. The URL: passwords never shown, timeouts only from remote_timeout


def test_passwords_in_the_url_are_redacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    for url in (
        f"redis://127.0.0.1:{port}/0?password=hunter2-in-query",
        f"redis://fleet:hunter2-in-userinfo@127.0.0.1:{port}/0?db=0",
    ):
        store = RemoteStore(url, SECRET.encode(), timeout=0.3)
        with caplog.at_level(logging.INFO, "fxcodegen"):
            assert not store.available()  # nothing listens: logged
        shown = repr(store) + "\n".join(r.getMessage() for r in caplog.records)
        assert "hunter2" not in shown and f"127.0.0.1:{port}" in shown, shown
        assert "***" in repr(store)
    assert "fleet:***@" in repr(store)


@pytest.mark.parametrize("param", ["socket_timeout=3600", "socket_connect_timeout=0", "timeout=9"])
def test_timeouts_in_the_url_query_are_refused(
    param: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?{param}"
    name = param.split("=")[0]
    with pytest.raises(ValueError, match=f"remote_cache sets {name}"):
        open_remote(url, SECRET)
    with pytest.raises(ValueError, match=f"remote_cache sets {name}"):
        fxcodegen.backend(splitting_ops=["aten::mm"], cache_dir=tmp_path, remote_cache=url)
    monkeypatch.setenv("FXCODEGEN_REMOTE_CACHE", url)
    with pytest.raises(ValueError, match=f"FXCODEGEN_REMOTE_CACHE sets {name}"):
        open_remote(None, SECRET)


# --------------------------------------------------------------------------------------
# 10. Malformed replies to the tools


@pytest.mark.parametrize("command", ["ls", "verify", "clear"])
def test_tools_meeting_malformed_replies_say_so_in_one_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FXCODEGEN_CACHE_SECRET", SECRET)
    with FakeRedis(wrong_types) as fake:
        assert cache_cli.main([command, "--remote", fake.url, "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "malformed reply to SCAN" in err, err


def test_a_malformed_reply_switches_the_store_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeRedis(wrong_types) as fake:
        coop = Coop(Cache(tmp_path / "c"), RemoteStore(fake.url, SECRET.encode(), timeout=1))
        with caplog.at_level(logging.INFO, "fxcodegen"):
            others, mine = coop.gather(_work(N))
    assert others == {} and len(mine) == N
    (w,) = _warnings(caplog)
    assert "malformed reply to" in w and "local cache only" in w, w


# --------------------------------------------------------------------------------------
# 11. File names in `cache verify`


def test_verify_escapes_file_names(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    _tiny_artifact(cache, "one")
    forged = "x\nALL GOOD: 0 artifact(s), 0 file(s) with problems\x1b[2K"
    (cache.root / "blobs" / forged).write_bytes(b"junk")
    os.close(os.open(os.fsencode(cache.root / "blobs") + b"/bad\xffname", os.O_CREAT | os.O_WRONLY))
    env = {**_env(), "PYTHONIOENCODING": "ascii", "LC_ALL": "C", "PYTHONUTF8": "0"}
    p = subprocess.run(
        [sys.executable, "-m", "fxcodegen", "cache", "verify", str(cache.root)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    lines = p.stdout.decode("ascii").splitlines()
    assert len(lines) == 3 and lines[-1].endswith("1 artifact(s), 2 file(s) with problems"), lines
    assert not any(line.startswith("ALL GOOD") for line in lines)
    assert b"\x1b" not in p.stdout and b"\xff" not in p.stdout
    assert any("x\\nALL GOOD" in line and "\\x1b[2K" in line for line in lines), lines
    assert any("bad\\xffname" in line for line in lines), lines


# --------------------------------------------------------------------------------------
# 12. Bad arguments name the parameter, whatever the others are


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"compile_ranges": 5}, TypeError, "compile_ranges must be a list"),
        ({"compile_ranges": "1-8"}, TypeError, "compile_ranges must be a list"),
        ({"compile_sizes": 5}, TypeError, "compile_sizes must be a list"),
        ({"remote_cache": 5}, TypeError, "remote_cache must be a redis:// URL string"),
        ({"remote_cache": ""}, ValueError, "remote_cache must be a redis:// URL"),
        ({"remote_timeout": 0}, ValueError, "remote_timeout must be"),
        ({"remote_timeout": -1}, ValueError, "remote_timeout must be"),
        ({"remote_timeout": math.nan}, ValueError, "remote_timeout must be"),
        ({"remote_timeout": math.inf}, ValueError, "remote_timeout must be"),
        ({"remote_timeout": 61}, ValueError, "remote_timeout must be"),
        ({"remote_timeout": "2"}, TypeError, "remote_timeout must be a number"),
        ({"cache_dir": ""}, ValueError, "cache_dir must not be empty"),
        ({"cache_dir": "", "compiler": "eager"}, ValueError, "cache_dir must not be empty"),
        ({"cache_dir": 5}, TypeError, "cache_dir must be a path"),
        ({"claim_wait": 0}, ValueError, "claim_wait must be"),
        ({"claim_wait": math.nan}, ValueError, "claim_wait must be"),
    ],
)
def test_bad_arguments_name_the_parameter(
    kwargs: dict[str, Any], error: type, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FXCODEGEN_CACHE_SECRET", raising=False)
    monkeypatch.delenv("FXCODEGEN_REMOTE_CACHE", raising=False)
    with pytest.raises(error, match=match):
        fxcodegen.backend(splitting_ops=["aten::mm"], **kwargs)
