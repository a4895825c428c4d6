"""The cache's files: writing them atomically, marking a directory as a cache, removing what
a writer that died or failed left, clearing a cache, and naming who holds a lock file.

Every file is written to a temporary file ``.tmp-*`` in its own directory and renamed into
place. The writer holds an exclusive ``flock`` on its temporary file from creation until
after the rename; the kernel drops it when the writer exits, SIGKILL included. So a
temporary file is **stale** when no process holds its lock and it is older than
:data:`TEMP_GRACE_S` (which covers the instant between creating the file and locking it).
Where ``flock`` does not exist, a temporary file is stale after :data:`ORPHAN_GRACE_S`.

A blob no artifact references, or a factors file without its artifact, may belong to a
store in flight (blobs and factors are written before the artifact that references them),
so it is an **orphan** only once it is older than :data:`ORPHAN_GRACE_S`; a store that
reuses an existing blob refreshes its time.

A directory is a cache when it holds the marker file (``layout.MARKER``), written at its
first use. :func:`clear` removes only what the cache itself creates, and only from a
marked directory that passes the checks loading does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path

from fxcodegen.cache import trust
from fxcodegen.cache.format import CacheError
from fxcodegen.cache.layout import (
    ARTIFACT_SUFFIX,
    BLOBS_DIR,
    ENTRIES_DIR,
    FACTORS_SUFFIX,
    FORMAT_VERSION,
    KEY_RE,
    LOCKS_DIR,
    MARKER,
)

try:
    import fcntl
except ImportError:  # not POSIX: temporary files are judged by age alone
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ORPHAN_GRACE_S",
    "TEMP_GRACE_S",
    "TMP_PREFIX",
    "atomic_write",
    "clear",
    "first_use",
    "lock_holder",
    "is_old",
    "marker_problem",
    "orphans",
    "real_dir",
    "stale_temps",
    "unlink",
    "waiting_on",
]

TMP_PREFIX = ".tmp-"
TEMP_GRACE_S = 60.0
"""A temporary file younger than this is never taken for a leftover."""
ORPHAN_GRACE_S = 3600.0
"""An unreferenced blob or a factors file without its artifact younger than this may belong
to a store in flight; older, it is an orphan."""

_TEMP_RE = re.compile(re.escape(TMP_PREFIX) + "[a-z0-9_]{8}")
"""The names ``tempfile.mkstemp`` gives: another ``.tmp-*`` file is not a writer's."""

_SWEEP_OPEN_FLAGS = (
    os.O_RDWR
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes) -> os.stat_result:
    """Write ``data`` to a locked 0600 temporary file next to ``path``, fsync it, rename it
    over ``path``: readers see the old file or the new one, never a part. Returns the
    written file's stat; on failure the temporary file is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until close: after the rename
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.fchmod(fd, 0o600)
        os.replace(tmp, path)
        st = os.fstat(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    return st


def is_old(st: os.stat_result, grace: float, now: float | None = None) -> bool:
    """Whether the file was last written more than ``grace`` seconds ago."""
    return (time.time() if now is None else now) - st.st_mtime > grace


def _check_temp(path: Path, *, remove: bool, now: float | None) -> bool:
    """Whether the temporary file ``path`` is stale (with ``remove``: and was removed).
    Anything else under a temporary file's name (a link, a FIFO) is never a writer's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISREG(st.st_mode):
        if not is_old(st, TEMP_GRACE_S, now):
            return False
        if fcntl is None:
            if not is_old(st, ORPHAN_GRACE_S, now):
                return False
        else:
            try:
                fd = os.open(path, _SWEEP_OPEN_FLAGS)
            except OSError:
                return False  # cannot tell: leave it
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return False  # a live writer holds it
                same = os.path.samestat(os.fstat(fd), st)
                # Removed while the lock is held: no writer can be using it.
                return same and (not remove or _unlink(path))
            finally:
                os.close(fd)
    return not remove or _unlink(path)


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except OSError:  # gone, or e.g. a read-only cache: nothing to heal there
        return False
    return True


def unlink(paths: list[Path]) -> list[Path]:
    """Remove each of ``paths`` that can be removed; the ones removed."""
    return [p for p in paths if _unlink(p)]


def real_dir(path: Path) -> bool:
    """A directory, not a link to one."""
    return path.is_dir() and not path.is_symlink()


def _temp_files(directory: Path) -> list[Path]:
    if not real_dir(directory):
        return []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / n for n in sorted(names) if _TEMP_RE.fullmatch(n)]


def stale_temps(root: Path, *, remove: bool = False) -> list[Path]:
    """The stale temporary files in the cache directory ``root`` and its ``blobs/``; with
    ``remove``, those removed."""
    return [
        p
        for d in (root, root / BLOBS_DIR)
        for p in _temp_files(d)
        if _check_temp(p, remove=remove, now=None)
    ]


def _old_orphan(path: Path) -> bool:
    try:
        return is_old(os.lstat(path), ORPHAN_GRACE_S)
    except OSError:
        return False


def orphans(root: Path, referenced: set[str] | None) -> list[Path]:
    """The orphans in the cache directory ``root``, each older than :data:`ORPHAN_GRACE_S`:
    factors files without their artifact and, unless ``referenced`` (the blobs the
    artifacts reference) is None, blobs not in ``referenced``."""
    out = []
    for p in sorted(root.glob(f"*{FACTORS_SUFFIX}")):
        artifact = root / (p.name[: -len(FACTORS_SUFFIX)] + ARTIFACT_SUFFIX)
        if not os.path.lexists(artifact) and _old_orphan(p):
            out.append(p)
    blob_dir = root / BLOBS_DIR
    if referenced is not None and real_dir(blob_dir):
        for name in sorted(os.listdir(blob_dir)):
            if KEY_RE.match(name) and name not in referenced and _old_orphan(blob_dir / name):
                out.append(blob_dir / name)
    return out


# The names a cache creates, per directory: nothing else is ever removed by `clear`.
_HEX = "[0-9a-f]{64}"
_TEMP = _TEMP_RE.pattern
_OWN_NAMES = {
    ".": re.compile(f"{_HEX}({re.escape(ARTIFACT_SUFFIX)}|{re.escape(FACTORS_SUFFIX)})|{_TEMP}"),
    BLOBS_DIR: re.compile(f"{_HEX}|{_TEMP}"),
    LOCKS_DIR: re.compile(f"{_HEX}\\.lock"),
    ENTRIES_DIR: re.compile(f"{_HEX}|{_TEMP}"),
}


def first_use(root: Path) -> None:
    """What a process does the first time it uses a trusted cache directory: mark it as a
    cache (when unmarked) and remove stale temporary files. Never raises (a read-only
    cache is still used)."""
    with contextlib.suppress(OSError):
        if not os.path.lexists(root / MARKER):
            doc = {"fxcodegen": "cache", "format": FORMAT_VERSION}
            atomic_write(root / MARKER, (json.dumps(doc) + "\n").encode())
    with contextlib.suppress(OSError):
        stale_temps(root, remove=True)


def marker_problem(root: Path) -> str | None:
    """Why ``root`` is not a marked cache directory, or None when it is."""
    try:
        raw, _ = trust.read_file(root / MARKER, max_bytes=4096)
        doc = json.loads(raw)
    except FileNotFoundError:
        return f"{root} is not an fxcodegen cache (no {MARKER})"
    except (OSError, ValueError) as e:
        return f"{root / MARKER} is not usable ({getattr(e, 'strerror', None) or e})"
    if not isinstance(doc, dict) or doc.get("fxcodegen") != "cache":
        return f"{root / MARKER} is not an fxcodegen cache marker"
    return None


def _own_files(root: Path) -> list[Path]:
    """The regular files of the cache's own names in ``root`` and its subdirectories;
    raises CacheError when a subdirectory is not trusted."""
    out = []
    for sub, pattern in _OWN_NAMES.items():
        d = root if sub == "." else root / sub
        if sub != ".":  # the cache directory itself is checked by the caller
            if not os.path.lexists(d):
                continue
            why = trust.directory_problem(d)
            if why:
                raise CacheError(d, why)
        for name in sorted(os.listdir(d)):
            with contextlib.suppress(OSError):
                if pattern.fullmatch(name) and stat.S_ISREG(os.lstat(d / name).st_mode):
                    out.append(d / name)
    return out


def clear(root: Path) -> int:
    """Remove every artifact, factors file, blob, lock, entry reference and temporary file
    of the cache directory ``root``: only names the cache creates, only regular files; the
    count. Raises :class:`CacheError` when ``root`` is not a marked cache directory or fails
    the checks loading applies (another user's link, writable by others, a linked
    ``blobs/``)."""
    try:
        why = trust.directory_problem(root, link_ok=True) or marker_problem(root)
        if why:
            raise CacheError(root, why)
        return len(unlink(_own_files(root)))
    except OSError as e:
        raise CacheError(root, f"cannot be cleared ({e.strerror or e})") from None


def lock_holder(path: Path) -> int | None:
    """The pid that holds a ``flock`` on ``path``, read from ``/proc/locks`` (Linux), or
    None when unknown."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    same_inode = None
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or not parts[4].isdigit():
            continue  # "->" lines are waiters, not holders
        if parts[5] == dev:
            return int(parts[4])
        if parts[5].rsplit(":", 1)[-1] == str(st.st_ino):
            same_inode = int(parts[4])  # e.g. overlayfs reports the lower device
    return same_inode


def waiting_on(path: Path) -> str:
    """Who holds the lock file ``path``, for a log line: ``"pid 123 (stopped)"``."""
    pid = lock_holder(path)
    if pid is None:
        return "a process this one cannot identify"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        state = ""
    return f"pid {pid}" + (" (stopped)" if state in ("T", "t") else "")
