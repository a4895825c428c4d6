"""The artifact cache under hostile or unlucky conditions: locks that cannot be taken,
leftovers of killed or failed writers, and files that must not be read as they are.

Every case must end the same way: the graph is compiled without the cache (or the cache
heals), one warning is logged, and nothing hangs, grows without bound or returns a wrong
result. Real processes are SIGKILLed; faults the machine cannot make on demand (a read-only
file system, a full disk) are injected on top of the real system calls. Only the public
API is used here.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest
from fxcodegen import cache_cli
from fxcodegen.cache import (
    Artifact,
    Cache,
    CacheError,
    LockUnavailable,
    PieceRecord,
    compute_key,
    load_artifact,
)

TESTS = Path(__file__).resolve().parent
PKG_PARENT = Path(cache_cli.__file__).resolve().parents[1]
OLD = 3 * 3600  # older than any grace period of the cache's sweeping rules

CODE = "def execution_fn(x):\n    return x * __fx_c0 + __fx_s0(x)\n"


def make_artifact(tag: int = 0) -> Artifact:
    entries = {"range:1-8": f"piece {tag} a".encode(), "size:4": f"piece {tag} b".encode()}
    return Artifact(
        code=CODE,
        submod_names=["submod_0"],
        consts=[10 + tag],
        pieces=[PieceRecord(name="submod_0", entries=entries, sym_shape_indices=(0,))],
        extra={"tag": tag},
    )


def tag_of(art: Artifact) -> int:
    """The artifact's tag, checked against its pool, pieces and code (a whole artifact)."""
    tag = art.extra["tag"]
    assert art.consts == [10 + tag]
    assert dict(art.pieces[0].entries) == dict(make_artifact(tag).pieces[0].entries)
    ns = {"__fx_c0": art.consts[0], "__fx_s0": lambda v: -v}
    exec(art.code_object, ns)
    assert ns["execution_fn"](2) == 2 * (10 + tag) - 2
    return tag


def factors(name: str = "base") -> dict:
    return {"graph": "sha256:" + "cd" * 32, "compiler": "fake", "name": name}


FACTORS = factors()
KEY = compute_key(FACTORS)
OTHER = factors("other")
OTHER_KEY = compute_key(OTHER)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "fxcodegen" and r.levelno >= logging.WARNING
    ]


def backdate(p: Path, seconds: float = OLD) -> None:
    t = time.time() - seconds
    os.utime(p, (t, t), follow_symlinks=False)


def tree(root: Path) -> list[tuple[str, int]]:
    """Every entry under ``root`` with its mtime, links not followed."""
    return sorted((str(p.relative_to(root)), p.lstat().st_mtime_ns) for p in root.rglob("*"))


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PKG_PARENT), str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    c = Cache(tmp_path / "cache")
    assert c.usable()
    return c


# --------------------------------------------------------------------------------------
# 4. Lock errors degrade to compiling without the cache, with one warning


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["EROFS", "EACCES"])
def test_lock_file_errno_compiles_without_cache_warning_once(
    code: int, cache: Cache, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only cache (an image baked before the model changed): hits still load; the
    lock of a miss cannot be taken, which callers treat as a timeout (they compile without
    the cache); one warning for all the misses."""
    assert cache.store(OTHER_KEY, OTHER, make_artifact(3)) is not None
    locks = str(cache.root / "locks")
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):  # on top of the real filelock
        if os.fspath(path).startswith(locks):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    caplog.clear()
    for _ in range(3):
        assert cache.load(KEY) is None
        with pytest.raises(filelock.Timeout) as info, cache.locked(KEY):
            pytest.fail("held a lock that cannot be taken")
        assert isinstance(info.value, LockUnavailable) and os.strerror(code) in str(info.value)
    assert tag_of(cache.load(OTHER_KEY)) == 3
    texts = warnings(caplog)
    assert len(texts) == 1, texts
    assert "lock" in texts[0] and os.strerror(code) in texts[0]


@pytest.mark.parametrize("kind", ["directory", "symlink", "dangling-symlink"])
def test_lock_path_not_a_file_compiles_without_cache_warning_once(
    kind: str, cache: Cache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock = cache.root / "locks" / f"{KEY}.lock"
    victim = tmp_path / "victim"
    victim.write_bytes(b"not the cache's to touch")
    if kind == "directory":
        lock.mkdir()
    elif kind == "symlink":
        lock.symlink_to(victim)
    else:
        lock.symlink_to(tmp_path / "nowhere" / "x")
    caplog.clear()
    for _ in range(2):
        assert cache.load(KEY) is None
        with pytest.raises(LockUnavailable), cache.locked(KEY):
            pytest.fail("held a lock that cannot be taken")
    texts = warnings(caplog)
    assert len(texts) == 1 and "lock" in texts[0], texts
    assert victim.read_bytes() == b"not the cache's to touch"
    assert not (tmp_path / "nowhere").exists()


# --------------------------------------------------------------------------------------
# 5. Leftovers of killed or failed writers are swept

STALLED_WRITER = """
import os, sys, time
from pathlib import Path
import test_cache_hardening as H
from fxcodegen.cache import Cache

root, ready = sys.argv[1:3]
real_replace = os.replace

def stall(src, dst):
    if str(dst).endswith(".fxc"):  # the artifact's temporary file is written: stop here
        Path(ready).write_text(str(src))
        time.sleep(600)
    return real_replace(src, dst)

os.replace = stall
Cache(root).store(H.KEY, H.FACTORS, H.make_artifact(1))
"""


def test_writer_killed_before_rename_leaves_nothing_that_lasts(
    cache: Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLED_WRITER, str(cache.root), str(ready)],
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the writer did not get to its rename"
            time.sleep(0.02)
        tmp = Path(ready.read_text())
        assert tmp.parent == cache.root and tmp.name.startswith(".tmp-")
        blobs = sorted((cache.root / "blobs").iterdir())
        assert len(blobs) == 2
        # A live writer's temporary file is never a leftover, however old it looks.
        backdate(tmp)
        assert Cache(cache.root).verify() == []
        assert Cache(cache.root).sweep() == []
        assert tmp.exists() and all(p.exists() for p in blobs)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # Dead, and (made to look) an hour later: its temporary file and orphans are problems...
    for p in [*blobs, cache.root / f"{KEY}.factors.json"]:
        backdate(p)
    problems = {(p, r) for p, r in Cache(cache.root).verify()}
    assert (tmp, "stale temporary file") in problems
    assert {(p, "unreferenced blob") for p in blobs} <= problems
    assert (cache.root / f"{KEY}.factors.json", "factors file without its artifact") in problems
    assert cache_cli.main(["verify", str(cache.root)]) == 1
    # ...and the next process to store removes them and stores its artifact.
    assert Cache(cache.root).store(OTHER_KEY, OTHER, make_artifact(2)) is not None
    assert not tmp.exists() and not any(p.exists() for p in blobs)
    assert not (cache.root / f"{KEY}.factors.json").exists()
    assert Cache(cache.root).verify() == []
    capsys.readouterr()
    assert cache_cli.main(["verify", str(cache.root)]) == 0
    assert tag_of(Cache(cache.root).load(OTHER_KEY)) == 2


def test_stale_temp_file_is_swept_by_a_process_that_only_loads(cache: Cache) -> None:
    """A killed rewrite of an artifact that every later process hits: the temporary file
    goes at the next process's first use, not only at its next store."""
    cache.store(KEY, FACTORS, make_artifact())
    tmp = cache.root / ".tmp-k1lled_w"  # a name as tempfile.mkstemp gives it
    tmp.write_bytes(b"partial")
    backdate(tmp)
    assert (tmp, "stale temporary file") in Cache(cache.root).verify()
    assert tag_of(Cache(cache.root).load(KEY)) == 0
    assert not tmp.exists() and Cache(cache.root).verify() == []


def test_disk_full_leaves_no_orphans_and_a_later_store_succeeds(
    cache: Cache, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_fsync = os.fsync

    def disk_full(fd: int) -> None:  # the artifact's data does not fit
        try:
            head = os.pread(fd, 8, 0)
        except OSError:  # a directory
            head = b""
        if head == b"FXCGART\x00":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full)
    caplog.clear()
    for _ in range(2):
        assert cache.load(KEY) is None
        assert cache.store(KEY, FACTORS, make_artifact()) is None
    texts = warnings(caplog)
    assert len(texts) == 1 and os.strerror(errno.ENOSPC) in texts[0], texts
    # Nothing of the failed stores is left: no blobs, no factors, no temporary files.
    left = [
        p
        for p in cache.root.rglob("*")
        if p.is_file() and p.parent.name != "locks" and p.name != "fxcodegen-cache.json"
    ]
    assert left == []
    assert cache.verify() == []
    monkeypatch.undo()
    # A later process with space stores the artifact; the one after loads it.
    later = Cache(cache.root)
    assert later.load(KEY) is None
    assert later.store(KEY, FACTORS, make_artifact()) is not None
    assert tag_of(Cache(cache.root).load(KEY)) == 0
    assert Cache(cache.root).verify() == []


def test_blob_reused_by_a_store_is_refreshed(cache: Cache) -> None:
    """A store that reuses an old blob refreshes its time, so a sweep elsewhere does not
    take it from under the artifact being written (blobs are written first)."""
    cache.store(OTHER_KEY, OTHER, make_artifact(1))  # this Cache's one sweep
    cache.store(KEY, FACTORS, make_artifact(0))
    blobs = sorted(p for p in (cache.root / "blobs").iterdir() if b"piece 0" in p.read_bytes())
    assert len(blobs) == 2
    for p in blobs:
        backdate(p)
    third = factors("third")
    cache.store(compute_key(third), third, make_artifact(0))  # the same two blobs
    assert all(time.time() - p.stat().st_mtime < 600 for p in blobs)
    assert cache.verify() == []


# --------------------------------------------------------------------------------------
# 6. Reading follows nothing it should not

HOSTILE_READER = """
import json, logging, resource, sys
import test_cache_hardening as H
from fxcodegen import cache_cli
from fxcodegen.cache import Cache

root = sys.argv[1]
warnings = []

class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())

logging.getLogger("fxcodegen").addHandler(Keep())
# What reading may cost from here on: 1 GiB more address space than the imports took.
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
verify = cache_cli.main(["verify", root])
cache = Cache(root)
cache.explain_miss(H.KEY, H.FACTORS)  # reads every factors file
loaded = cache.load(H.KEY, H.FACTORS) is not None
stored = cache.store(H.KEY, H.FACTORS, H.make_artifact()) is not None
print(json.dumps({"verify": verify, "loaded": loaded, "stored": stored,
                  "tag": H.tag_of(cache.load(H.KEY)), "warnings": warnings}))
"""


def run_hostile_reader(root: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", HOSTILE_READER, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,  # a hang fails the test here
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _zero_device(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(5 << 30)  # 5 GiB that take no space
    os.chmod(path, 0o600)


HOSTILE = {
    "fifo": lambda p: os.mkfifo(p, 0o600),
    "symlink-to-dev-zero": lambda p: p.symlink_to("/dev/zero"),
    "zero-device": _zero_device,
    "sparse-5-GiB": _sparse,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_file_in_place_of_artifact_is_refused_without_reading(
    kind: str, cache: Cache
) -> None:
    """Neither a FIFO (open blocks), nor /dev/zero (reads forever) nor a huge sparse file
    is read: each is a warned miss, verify reports it, and the store replaces it."""
    cache.store(OTHER_KEY, OTHER, make_artifact(1))
    path = cache.artifact_path(KEY)
    HOSTILE[kind](path)
    # explain_miss reads every factors file: a FIFO there must not block either.
    os.mkfifo(cache.root / f"{'e' * 64}.factors.json", 0o600)
    out = run_hostile_reader(cache.root)
    assert out["verify"] == 1
    assert not out["loaded"] and out["stored"] and out["tag"] == 0
    assert len(out["warnings"]) == 1 and str(path) in out["warnings"][0], out["warnings"]
    assert stat.S_ISREG(os.lstat(path).st_mode) and os.lstat(path).st_size < 1 << 20
    assert tag_of(cache.load(KEY)) == 0


@pytest.mark.parametrize("where", ["artifact", "blob"])
def test_symlink_inside_the_cache_is_not_followed(
    where: str, cache: Cache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A link to a valid file elsewhere is still not read: only the cache's own files are."""
    cache.store(KEY, FACTORS, make_artifact(7))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    saved_artifact = elsewhere / "artifact"
    saved_artifact.write_bytes(cache.artifact_path(KEY).read_bytes())
    cache.store(KEY, FACTORS, make_artifact(0))  # tag 7's blobs stay, unreferenced
    if where == "artifact":
        path = cache.artifact_path(KEY)
        path.unlink()
        path.symlink_to(saved_artifact)  # a whole, valid artifact (tag 7)
    else:
        path = sorted(p for p in (cache.root / "blobs").iterdir() if b"piece 0" in p.read_bytes())[
            0
        ]
        copy = elsewhere / "blob"
        copy.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(copy)
    caplog.clear()
    assert cache.load(KEY) is None
    assert "symbolic link" in "\n".join(warnings(caplog))
    with pytest.raises(CacheError, match="symbolic link"):
        load_artifact(cache.artifact_path(KEY))
    assert any("symbolic link" in r for p, r in cache.verify() if p == path)
    assert cache.store(KEY, FACTORS, make_artifact()) is not None
    assert not path.is_symlink()
    assert tag_of(cache.load(KEY)) == 0


def test_cache_dir_symlink_owned_by_another_user_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "target"
    Cache(target).store(KEY, FACTORS, make_artifact(4))
    mine = tmp_path / "mine"
    mine.symlink_to(target)
    assert tag_of(Cache(mine).load(KEY)) == 4  # this user's own link: followed
    theirs = tmp_path / "theirs"
    theirs.symlink_to(target)
    other_uid = os.geteuid() + 4242
    os.lchown(theirs, other_uid, other_uid)
    before = tree(target)
    cache = Cache(theirs)
    caplog.clear()
    assert cache.load(KEY) is None
    assert not cache.usable()  # the backend compiles without the cache
    assert cache.store(KEY, FACTORS, make_artifact(5)) is None
    texts = warnings(caplog)
    assert len(texts) == 1 and f"owned by another user (uid {other_uid})" in texts[0], texts
    assert tree(target) == before


def test_blobs_dir_symlink_is_not_trusted_nor_cleared_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    Cache(root).store(KEY, FACTORS, make_artifact())
    elsewhere = tmp_path / "elsewhere"
    (root / "blobs").rename(elsewhere)
    (root / "blobs").symlink_to(elsewhere)
    kept = sorted(p.name for p in elsewhere.iterdir())
    cache = Cache(root)
    caplog.clear()
    assert cache.load(KEY) is None
    assert "symbolic link" in "\n".join(warnings(caplog))
    with pytest.raises(CacheError, match="blobs is a symbolic link"):
        cache.clear()
    assert sorted(p.name for p in elsewhere.iterdir()) == kept
