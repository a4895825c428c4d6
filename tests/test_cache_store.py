"""The artifact cache's storage layer (``fxcodegen.cache``), with synthetic payloads.

No torch compilation here: pieces are opaque bytes, the stitching code is a small real
function, the pool holds picklable Python values. The backend's use of the cache is
tested with the backend.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import host_details_in
from fxcodegen import cache as C
from fxcodegen import cache_cli
from fxcodegen.cache import Artifact, Cache, CacheError, PieceRecord, files, load_artifact, trust
from fxcodegen.cache import format as fmt

TESTS = Path(__file__).resolve().parent
PKG_PARENT = Path(C.__file__).resolve().parents[1]

CODE = textwrap.dedent(
    """\
    def execution_fn(x):
        y = __fx_s0(x)
        return y * __fx_c0 + len(__fx_c1)
    """
)


def blob(tag: int, entry: int, big: int = 0) -> bytes:
    return f"compiled piece tag={tag} entry={entry};".encode() * (1 + big)


def make_artifact(tag: int = 0, big: int = 0) -> Artifact:
    """Two structurally identical pieces (shared blobs), two entries each."""
    entries = {"range:1-8": blob(tag, 0, big), "size:4": blob(tag, 1, big)}
    pieces = [
        PieceRecord(
            name=name,
            entries=dict(entries),
            sym_shape_indices=(0,),
            returns_tuple=returns_tuple,
            compile_ranges=((1, 8),),
            compile_sizes=(4,),
            extra={"compiler": "fake"},
        )
        for name, returns_tuple in (("submod_0", False), ("submod_2", True))
    ]
    return Artifact(
        code=CODE,
        submod_names=["submod_0", "submod_1", "submod_2"],
        consts=[3 + tag, ["k"] * (2 + tag + big)],
        pieces=pieces,
        extra={"tag": tag},
    )


def run_code(art: Artifact, x: int) -> int:
    ns = {"__fx_s0": lambda v: v + 1, "__fx_c0": art.consts[0], "__fx_c1": art.consts[1]}
    exec(art.code_object, ns)
    return ns["execution_fn"](x)


def check_artifact(art: Artifact, tag: int = 0, big: int = 0) -> None:
    want = make_artifact(tag, big)
    assert art.code == want.code
    assert art.submod_names == want.submod_names
    assert art.consts == want.consts
    assert art.extra == {"tag": tag}
    assert [p.name for p in art.pieces] == ["submod_0", "submod_2"]
    for got, exp in zip(art.pieces, want.pieces, strict=True):
        assert dict(got.entries) == dict(exp.entries)
        assert got.sym_shape_indices == exp.sym_shape_indices
        assert got.returns_tuple == exp.returns_tuple
        assert got.compile_ranges == exp.compile_ranges
        assert got.compile_sizes == exp.compile_sizes
        assert dict(got.extra) == {"compiler": "fake"}
    assert run_code(art, 2) == 3 * (3 + tag) + 2 + tag + big


def fake_factors(**changes) -> dict:
    factors = {
        "format": C.FORMAT_VERSION,
        "graph": "sha256:" + "ab" * 32,
        "splitting_ops": ["fx.attn.default"],
        "compile_ranges": [[1, 8]],
        "compile_sizes": [4],
        "compiler": "fake",
        "compiler_options": {},
        "torch": "0.0-test",
    }
    factors.update(changes)
    return factors


FACTORS = fake_factors()
KEY = C.compute_key(FACTORS)


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


def warnings_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        r.getMessage()
        for r in caplog.records
        if r.name == "fxcodegen" and r.levelno >= logging.WARNING
    )


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PKG_PARENT), str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


# --------------------------------------------------------------------------------------
# Round trip and layout


def test_round_trip(cache: Cache) -> None:
    path = cache.store(KEY, FACTORS, make_artifact())
    assert path == cache.artifact_path(KEY)
    art = cache.load(KEY)
    assert art is not None
    check_artifact(art)
    assert art.code_origin == "marshal"
    assert art.key == KEY and art.format_version == C.FORMAT_VERSION
    assert art.factors == FACTORS
    # The factors file is human-readable JSON next to the artifact.
    doc = json.loads(cache.factors_path(KEY).read_text())
    assert doc["key"] == KEY and doc["factors"] == FACTORS
    # The explicit API gives the same.
    check_artifact(load_artifact(path))


def test_blobs_are_stored_once_per_content(cache: Cache) -> None:
    cache.store(KEY, FACTORS, make_artifact(0))
    # 2 pieces x 2 entries, identical between the pieces: 2 blobs.
    assert len(list((cache.root / "blobs").iterdir())) == 2
    other = C.compute_key(fake_factors(compile_sizes=[4, 5]))
    cache.store(other, fake_factors(compile_sizes=[4, 5]), make_artifact(0))
    assert len(list((cache.root / "blobs").iterdir())) == 2  # shared across artifacts too
    cache.store(
        C.compute_key(fake_factors(compiler="x")), fake_factors(compiler="x"), make_artifact(1)
    )
    assert len(list((cache.root / "blobs").iterdir())) == 4


def test_code_object_from_other_python_falls_back_to_source(
    cache: Cache, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fmt, "code_tag", lambda: "cpython-399:0d0d0d0a")
    cache.store(KEY, FACTORS, make_artifact())
    monkeypatch.undo()
    caplog.set_level(logging.INFO, logger="fxcodegen")
    art = cache.load(KEY)
    assert art is not None
    assert art.code_origin == "source"
    check_artifact(art)
    assert "written by another Python" in caplog.text
    assert art.code_object.co_filename == art.filename == f"<fxcodegen-cache-{KEY[:16]}>"


def test_older_format_without_pool_loads_with_consts_none(cache: Cache) -> None:
    code = "def execution_fn(x):\n    return __fx_s0(x) * 2\n"
    old = Artifact(code=code, submod_names=["submod_0"], consts=[1, 2], pieces=[])
    data, blobs = C.encode_artifact(old, KEY, FACTORS, version=1)
    assert not blobs
    cache.usable()  # creates the directory
    files.atomic_write(cache.artifact_path(KEY), data)
    art = cache.load(KEY)
    assert art is not None
    assert art.format_version == 1
    assert art.consts is None  # the pool was never written: the consts=None path
    ns = {"__fx_s0": lambda v: v + 1}
    exec(art.code_object, ns)
    assert ns["execution_fn"](4) == 10


def test_bind_stored_binds_code_object_without_compiling(
    cache: Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fxcodegen._core", reason="needs the compiled core")
    from fxcodegen.codegen import bind_stored

    cache.store(KEY, FACTORS, make_artifact())
    art = cache.load(KEY)
    assert art is not None and art.code_origin == "marshal"

    def no_compile(*args, **kwargs):
        raise AssertionError("compile() called on a warm load")

    monkeypatch.setattr("builtins.compile", no_compile)
    fn = bind_stored(art, {"submod_0": lambda v: v + 1})
    assert fn(2) == 3 * 3 + 2
    assert fn.__code__.co_filename == art.filename


# --------------------------------------------------------------------------------------
# Damage: detected before unpickling, warned, missed, healed by the next store


def _flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x10]) + data[pos + 1 :]


def _with_version(data: bytes, version: int) -> bytes:
    magic, _, length, digest = fmt.HEADER.unpack_from(data)
    return fmt.HEADER.pack(magic, version, length, digest) + data[fmt.HEADER.size :]


DAMAGE = {
    "truncated": (lambda d: d[: len(d) // 2], "truncated"),
    "truncated-header": (lambda d: d[:10], "truncated header"),
    "bit-flip-payload": (lambda d: _flip(d, len(d) - 7), "checksum mismatch"),
    "bit-flip-digest": (lambda d: _flip(d, fmt.HEADER.size - 1), "checksum mismatch"),
    "bit-flip-magic": (lambda d: _flip(d, 0), "bad magic"),
    "empty": (lambda d: b"", "empty file"),
    "wrong-version": (lambda d: _with_version(d, 99), "unknown format version 99"),
    "trailing-bytes": (lambda d: d + b"\0", "trailing bytes"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_artifact_is_a_warned_miss_and_heals(
    kind: str, cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    damage, reason = DAMAGE[kind]
    path = cache.store(KEY, FACTORS, make_artifact())
    assert path is not None
    path.write_bytes(damage(path.read_bytes()))

    # The explicit API raises CacheError naming the file and the reason.
    with pytest.raises(CacheError, match=reason) as info:
        load_artifact(path)
    assert info.value.path == path

    # The backend-facing API warns and misses; it never raises.
    caplog.clear()
    assert cache.load(KEY) is None
    text = warnings_text(caplog)
    assert str(path) in text and reason in text

    # The artifact compiled afresh replaces the damaged one; the next load hits.
    assert cache.store(KEY, FACTORS, make_artifact()) == path
    check_artifact(load_artifact(path))
    caplog.clear()
    check_artifact(cache.load(KEY))
    assert warnings_text(caplog) == ""
    assert cache.verify() == []


def test_unreadable_artifact_is_a_warned_miss_and_heals(
    cache: Cache, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = cache.store(KEY, FACTORS, make_artifact())
    assert path is not None
    bad_inode = os.stat(path).st_ino
    os.chmod(path, 0)
    real_read = trust.read_file

    def read(p: Path, **kwargs):
        # chmod 000 does not stop root: make the damaged inode unreadable for anyone.
        if Path(p) == path and os.stat(p).st_ino == bad_inode:
            raise PermissionError(13, "Permission denied", str(p))
        return real_read(p, **kwargs)

    monkeypatch.setattr(trust, "read_file", read)
    with pytest.raises(CacheError, match="unreadable"):
        load_artifact(path)
    caplog.clear()
    assert cache.load(KEY) is None
    text = warnings_text(caplog)
    assert str(path) in text and "unreadable" in text
    assert cache.store(KEY, FACTORS, make_artifact()) == path
    assert os.stat(path).st_ino != bad_inode
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    check_artifact(load_artifact(path))


@pytest.mark.parametrize("kind", ["bit-flip", "truncated", "missing", "writable-by-others"])
def test_damaged_or_untrusted_blob_is_a_warned_miss_and_heals(
    kind: str, cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    cache.store(KEY, FACTORS, make_artifact())
    bpath = sorted((cache.root / "blobs").iterdir())[0]
    data = bpath.read_bytes()
    if kind == "missing":
        bpath.unlink()
    elif kind == "writable-by-others":
        os.chmod(bpath, 0o666)
    else:
        bpath.write_bytes(_flip(data, len(data) - 1) if kind == "bit-flip" else data[:-3])
    with pytest.raises(CacheError) as info:
        load_artifact(cache.artifact_path(KEY))
    assert info.value.path == bpath
    if kind == "writable-by-others":
        assert info.value.reason == "not trusted: writable by others (mode 0666)"
    caplog.clear()
    assert cache.load(KEY) is None
    assert str(bpath) in warnings_text(caplog)
    assert cache.store(KEY, FACTORS, make_artifact()) is not None
    assert bpath.read_bytes() == data  # rewritten intact
    assert _mode(bpath) == 0o600
    check_artifact(cache.load(KEY))


def test_pool_that_does_not_pickle_is_not_stored(
    cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    art = make_artifact()
    art.consts.append(lambda: None)
    assert cache.store(KEY, FACTORS, art) is None
    assert "cannot serialize" in warnings_text(caplog)
    assert not cache.artifact_path(KEY).exists()
    assert not cache.factors_path(KEY).exists() and not any((cache.root / "blobs").iterdir())
    assert cache.load(KEY) is None


def test_pool_with_torch_values_and_operators_round_trips(cache: Cache) -> None:
    import torch

    pool = [
        torch.ops.aten.add.Tensor,
        torch.ops.aten.mm,
        torch.ops.higher_order.cond,
        torch.arange(6).view(2, 3)[:, 1:],
        torch.float16,
        torch.device("cpu"),
        torch.Size([2, 3]),
        slice(1, None, 2),
    ]
    art = Artifact(code="def execution_fn():\n    return None\n", submod_names=[], consts=pool)
    cache.store(KEY, FACTORS, art)
    got = cache.load(KEY).consts
    assert got[0] is torch.ops.aten.add.Tensor
    assert got[1] is torch.ops.aten.mm
    assert got[2] is torch.ops.higher_order.cond
    assert torch.equal(got[3], pool[3]) and got[3].stride() == pool[3].stride()
    assert got[4:] == pool[4:]


def test_prepared_artifact_is_filled_in_as_a_load_would(cache: Cache) -> None:
    """A freshly made artifact, prepared, has what a loaded one has (its key, factors and a
    code object under the synthetic file name), compiled from source once."""
    art = make_artifact()
    assert art.prepare(KEY, FACTORS) is art
    assert art.code_origin == "source" and art.key == KEY and art.factors == FACTORS
    assert art.code_object.co_filename == art.filename == f"<fxcodegen-cache-{KEY[:16]}>"
    code = art.code_object
    assert art.prepare(KEY, FACTORS).code_object is code
    check_artifact(art)
    assert not cache.artifact_path(KEY).exists()  # preparing stores nothing


def test_artifact_stored_under_another_key_is_rejected(cache: Cache) -> None:
    other = C.compute_key(fake_factors(compiler="other"))
    cache.store(other, fake_factors(compiler="other"), make_artifact())
    shutil.copy(cache.artifact_path(other), cache.artifact_path(KEY))
    assert cache.load(KEY) is None


# --------------------------------------------------------------------------------------
# Many processes

WRITER = """
import json, os, sys, time
from pathlib import Path
import test_cache_store as T
from fxcodegen.cache import Cache

root, key, ready_dir, go, delay, heal = sys.argv[1:7]
factors = T.FACTORS
cache = Cache(root)

def compiled():
    time.sleep(float(delay))  # a compile
    return T.make_artifact(0, big=2000).prepare(key, factors)

assert cache.load(key) is None  # every process misses before any stores
Path(ready_dir, str(os.getpid())).touch()
while not os.path.exists(go):
    time.sleep(0.002)
held = None
if heal == "1":  # as the backend replaces an artifact it cannot use
    with cache.locked(key):
        t0 = time.time()
        assert cache.store(key, factors, compiled()) is not None
        held = [t0, time.time()]
else:  # as the backend stores a miss: without the key's lock
    assert cache.store(key, factors, compiled()) is not None
T.check_artifact(cache.load(key), 0, big=2000)
print(json.dumps({"held": held}))
"""


def test_concurrent_processes_storing_one_key_leave_one_whole_artifact(tmp_path: Path) -> None:
    """Processes that all miss one key at once store it together, half of them under the
    key's lock: every store succeeds, every process then loads a whole artifact, the lock
    holders never overlap, and nothing is left behind."""
    n, delay = 8, 0.4
    root, ready, go = tmp_path / "cache", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), KEY, str(ready), str(go), str(delay)]
            + [str(i % 2)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < n:
        assert time.monotonic() < deadline, "children did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "WARNING" not in err, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    held = sorted(r["held"] for r in results if r["held"] is not None)
    print(f"\n{n} processes, same key, empty cache: lock held {held}")
    assert len(held) == n // 2
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(held)), held  # one holder at a time
    check_artifact(load_artifact(Cache(root).artifact_path(KEY)), 0, big=2000)
    assert Cache(root).verify() == []
    assert not list(root.glob(".tmp-*")) and not list((root / "blobs").glob(".tmp-*"))


READER = """
import json, logging, sys, time
import test_cache_store as T
from fxcodegen.cache import Cache

root, key, seconds, ready = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
warnings = []

class H(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())

logging.getLogger("fxcodegen").addHandler(H())
cache = Cache(root)
hits = misses = 0
open(ready, "w").close()
end = time.monotonic() + seconds
while time.monotonic() < end:
    art = cache.load(key)
    if art is None:
        misses += 1
        continue
    tag = art.extra["tag"]
    T.check_artifact(art, tag, big=20000)
    hits += 1
print(json.dumps({"hits": hits, "misses": misses, "warnings": warnings}))
"""


def test_readers_never_see_a_partial_artifact(tmp_path: Path) -> None:
    """A writer rewrites one key with alternating ~1 MB contents, without the lock, while
    readers load it in a loop: every load is a miss (not yet written) or a whole artifact."""
    root = tmp_path / "cache"
    cache = Cache(root)
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(root), KEY, "2", str(tmp_path / f"ready{i}")],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    writes = 0
    writes_while_all_read = 0
    while any(p.poll() is None for p in readers):  # keep writing until every reader is done
        assert cache.store(KEY, FACTORS, make_artifact(writes % 3, big=20000)) is not None
        writes += 1
        if all((tmp_path / f"ready{i}").exists() for i in range(3)):
            writes_while_all_read += 1
    results = []
    for p in readers:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"\nwrites={writes} (while all read: {writes_while_all_read}) "
        f"reader (hits, misses)={[(r['hits'], r['misses']) for r in results]}"
    )
    assert writes_while_all_read > 3
    assert all(r["warnings"] == [] for r in results), results
    assert sum(r["hits"] for r in results) > 0


# --------------------------------------------------------------------------------------
# Keys, moving, permissions, explanations


def test_moved_cache_directory_still_hits(tmp_path: Path) -> None:
    old = tmp_path / "old-place" / "cache"
    Cache(old).store(KEY, FACTORS, make_artifact())
    new = tmp_path / "elsewhere" / "renamed"
    new.parent.mkdir()
    shutil.move(old, new)
    art = Cache(new).load(KEY)
    assert art is not None
    check_artifact(art)
    for p in new.rglob("*"):
        if p.is_file():
            assert str(tmp_path).encode() not in p.read_bytes(), p


def key_kwargs() -> dict:
    return dict(
        graph=b"serialized node list",
        splitting_ops=["fx.attn.default", "aten.mm"],
        compile_ranges=[(1, 8), (9, 64)],
        compile_sizes=[4],
        compiler="inductor",
        # a function and an object: their reprs carry addresses, which must not enter
        compiler_options={"config_patches": {"fn": make_artifact, "obj": object()}},
    )


def test_key_is_stable_across_processes_and_free_of_host_details(tmp_path: Path) -> None:
    kwargs = key_kwargs()
    factors = C.make_factors(**kwargs)
    script = (
        "from fxcodegen import cache as C; import test_cache_store as T\n"
        "print(C.compute_key(C.make_factors(**T.key_kwargs())))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == C.compute_key(factors)
    assert host_details_in(json.dumps(factors)) == []
    for name in ("torch", "python", "fxcodegen", "compiler", "graph", "splitting_ops"):
        assert name in factors
    # Each factor changes the key.
    base = C.compute_key(factors)
    for change in (
        {"graph": b"another node list"},
        {"splitting_ops": ["aten.mm"]},
        {"compile_ranges": [(1, 8), (9, 32)]},
        {"compile_sizes": [4, 8]},
        {"compiler": "eager"},
        {"compiler_options": {"config_patches": {"max_autotune": True}}},
    ):
        assert C.compute_key(C.make_factors(**{**kwargs, **change})) != base, change
    # Order of splitting ops and sizes does not matter.
    same = {**kwargs, "splitting_ops": ["aten.mm", "fx.attn.default"], "compile_sizes": [4, 4]}
    assert C.compute_key(C.make_factors(**same)) == base


def test_miss_explanation_names_the_differing_factor(
    cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fxcodegen")
    assert "no other artifact" in cache.explain_miss(KEY, FACTORS)
    cache.store(KEY, FACTORS, make_artifact())
    far = fake_factors(compiler="other", torch="9.9", compile_ranges=[[1, 4]])
    cache.store(C.compute_key(far), far, make_artifact())
    near = fake_factors(compile_ranges=[[1, 16]])
    caplog.clear()
    assert cache.load(C.compute_key(near), near) is None
    lines = [r.getMessage() for r in caplog.records if "miss for" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert f"nearest artifact {KEY[:16]}" in lines[0]
    assert "compile_ranges: [[1, 8]] -> [[1, 16]]" in lines[0]
    assert "compiler" not in lines[0].replace("compile_ranges", "")


def backdate(p: Path, seconds: float = 2 * files.ORPHAN_GRACE_S) -> None:
    """Make ``p`` look last written ``seconds`` ago (without following a link)."""
    t = time.time() - seconds
    os.utime(p, (t, t), follow_symlinks=False)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_created_owner_only_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        cache = Cache(tmp_path / "c")
        assert cache.usable()  # the backend's first call: creates the directories
        with cache.locked(KEY):
            assert cache.store(KEY, FACTORS, make_artifact()) is not None
    finally:
        os.umask(old)
    for d in (cache.root, cache.root / "blobs", cache.root / "locks"):
        assert _mode(d) == 0o700, d
    written = [p for p in cache.root.rglob("*") if p.is_file()]
    assert len(written) == 6  # marker, artifact, factors, 2 blobs, the lock
    for p in written:
        assert _mode(p) == 0o600, p


@pytest.mark.parametrize("mode", [0o770, 0o757, 0o1777])
def test_directory_writable_by_others_is_bypassed(
    mode: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "shared"
    Cache(root).store(KEY, FACTORS, make_artifact())
    os.chmod(root, mode)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in root.rglob("*"))
    cache = Cache(root)
    caplog.clear()
    assert cache.load(KEY) is None
    assert "writable by others" in warnings_text(caplog)
    assert not cache.usable()  # the backend compiles without the cache
    assert cache.store(KEY, FACTORS, make_artifact(5)) is None
    assert sorted((p.name, p.stat().st_mtime_ns) for p in root.rglob("*")) == before
    assert warnings_text(caplog).count("writable by others") == 1  # warned once per cache


def test_artifact_writable_by_others_is_not_read_and_is_replaced(
    cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    path = cache.store(KEY, FACTORS, make_artifact())
    os.chmod(path, 0o666)
    caplog.clear()
    assert cache.load(KEY) is None
    assert "writable by others" in warnings_text(caplog)
    with pytest.raises(CacheError, match="writable by others"):
        load_artifact(path)
    assert cache.store(KEY, FACTORS, make_artifact()) == path
    assert _mode(path) == 0o600
    assert cache.load(KEY) is not None


def test_cache_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXCODEGEN_CACHE_DIR", str(tmp_path / "env"))
    assert C.resolve_cache_dir(None) == tmp_path / "env"
    assert C.open_cache(None).root == tmp_path / "env"
    assert C.resolve_cache_dir(False) is None and C.open_cache(False) is None
    assert C.resolve_cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("FXCODEGEN_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.resolve_cache_dir(None) == tmp_path / "home" / ".cache" / "fxcodegen"


def test_lock_serializes_holders(cache: Cache) -> None:
    import filelock

    cache.usable()
    with cache.locked(KEY):
        other = Cache(cache.root)
        with pytest.raises(filelock.Timeout), other.locked(KEY, timeout=0.1):
            pass
    with Cache(cache.root).locked(KEY, timeout=0.1):
        pass


# --------------------------------------------------------------------------------------
# The CLI


def test_cli_ls_show_verify_clear(cache: Cache, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(cache.root)
    cache.store(KEY, FACTORS, make_artifact())
    other = fake_factors(compile_sizes=[])
    cache.store(C.compute_key(other), other, make_artifact(1))

    assert cache_cli.main(["ls", root]) == 0
    out = capsys.readouterr().out
    assert "2 artifact(s)" in out
    assert KEY[:16] in out and "pieces=2 entries=4" in out
    assert "compiler=fake" in out and "compile_ranges=(1, 8)" in out

    assert cache_cli.main(["show", KEY[:10], root]) == 0
    assert capsys.readouterr().out == CODE
    assert cache_cli.main(["show", KEY[:10], root, "--factors"]) == 0
    assert json.loads(capsys.readouterr().out) == FACTORS
    assert cache_cli.main(["show", "ffffffffff", root]) == 1
    capsys.readouterr()

    assert cache_cli.main(["verify", root]) == 0
    assert "0 file(s) with problems" in capsys.readouterr().out
    path = cache.artifact_path(KEY)
    path.write_bytes(_flip(path.read_bytes(), 60))
    assert cache_cli.main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert f"{path}: checksum mismatch" in out
    assert cache_cli.main(["ls", root]) == 0
    assert "DAMAGED: checksum mismatch" in capsys.readouterr().out

    assert cache_cli.main(["clear", root]) == 0
    assert "removed" in capsys.readouterr().out
    assert cache.keys() == [] and list((cache.root / "blobs").iterdir()) == []
    assert cache_cli.main(["ls", root]) == 0
    assert "0 artifact(s)" in capsys.readouterr().out


def test_cli_default_dir_from_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FXCODEGEN_CACHE_DIR", str(tmp_path / "envcache"))
    Cache(tmp_path / "envcache").store(KEY, FACTORS, make_artifact())
    assert cache_cli.main(["ls"]) == 0
    assert KEY[:16] in capsys.readouterr().out


def test_verify_reports_insecure_and_orphans(cache: Cache) -> None:
    cache.store(KEY, FACTORS, make_artifact())
    orphan = cache.root / "blobs" / ("0" * 64)
    orphan.write_bytes(fmt.encode_blob(b"x"))
    os.chmod(cache.artifact_path(KEY), 0o620)
    problems = {(p.name, r.split(" (")[0]) for p, r in cache.verify()}
    assert (f"{KEY}.fxc", "writable by others") in problems
    assert ("0" * 64, "blob checksum mismatch") in problems
    # A fresh unreferenced blob may belong to a store in flight; an old one is an orphan.
    assert ("0" * 64, "unreferenced blob") not in problems
    backdate(orphan)
    problems = {(p.name, r.split(" (")[0]) for p, r in cache.verify()}
    assert ("0" * 64, "unreferenced blob") in problems
