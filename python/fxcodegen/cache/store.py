"""The local store: a cache directory (:mod:`~fxcodegen.cache.layout`), its per-key locks,
loading and storing artifacts, and removing leftovers.

The backend-facing methods of :class:`Cache` (``usable``, ``load``, ``store``) never raise
because of the cache: a damaged, hostile, unreadable or read-only cache is logged on the
``fxcodegen`` logger and treated as a miss, and the graph is compiled without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import filelock

from fxcodegen.cache import contents, files, layout, trust
from fxcodegen.cache.artifact import Artifact, canonical
from fxcodegen.cache.contents import StoredInfo
from fxcodegen.cache.format import (
    CacheError,
    decode_artifact,
    decode_blob,
    encode_artifact,
    encode_blob,
    read_trusted,
)
from fxcodegen.cache.layout import BLOBS_DIR, FORMAT_VERSION, KEY_RE, LOCKS_DIR
from fxcodegen.cache.options import check_cache_dir

__all__ = [
    "ENV_VAR",
    "Cache",
    "LockUnavailable",
    "StoredInfo",
    "open_cache",
    "resolve_cache_dir",
]

log = logging.getLogger("fxcodegen")

ENV_VAR = "FXCODEGEN_CACHE_DIR"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | bool | None) -> Path | None:
    """``None`` -> ``$FXCODEGEN_CACHE_DIR``, else ``~/.cache/fxcodegen``; ``False`` -> disabled
    (``None``); a path -> that path (:func:`~fxcodegen.cache.options.check_cache_dir`)."""
    cache_dir = check_cache_dir(cache_dir)
    if cache_dir is False:
        return None
    if cache_dir is None:
        env = os.environ.get(ENV_VAR)
        if env:
            return Path(env).expanduser()
        return Path("~/.cache/fxcodegen").expanduser()
    return Path(cache_dir).expanduser()


def open_cache(cache_dir: str | os.PathLike[str] | bool | None, **kwargs: Any) -> Cache | None:
    """The :class:`Cache` for a backend's ``cache_dir`` argument, or None when disabled."""
    root = resolve_cache_dir(cache_dir)
    return None if root is None else Cache(root, **kwargs)


class LockUnavailable(filelock.Timeout):
    """The per-key lock cannot be taken at all: a read-only cache (EROFS, EACCES), or a
    directory or a symbolic link in the lock file's place.

    A subclass of ``filelock.Timeout``: a caller that compiles without the cache when the
    lock is not acquired in time does the same here."""

    def __init__(self, lock_file: str, reason: str = "") -> None:
        super().__init__(lock_file)
        self.lock_file_path = lock_file
        self.reason = reason

    def __str__(self) -> str:
        return f"cannot take the lock {self.lock_file_path}: {self.reason}"


class Cache:
    """A cache directory. Thread- and process-safe; the backend-facing methods never raise."""

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 3600.0) -> None:
        self.root = Path(root).expanduser()
        self.lock_timeout = lock_timeout
        self._trust: str | None | bool = False  # False: not checked yet; None: trusted
        self._warned: set[str] = set()
        self._temps_swept = False
        self._swept = False

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    # paths
    def artifact_path(self, key: str) -> Path:
        return layout.artifact_path(self.root, key)

    def factors_path(self, key: str) -> Path:
        return layout.factors_path(self.root, key)

    def blob_path(self, digest: str) -> Path:
        return layout.blob_path(self.root, digest)

    def lock_path(self, key: str) -> Path:
        return layout.lock_path(self.root, key)

    # trust
    def _warn_once(self, topic: str, message: str, *args: Any) -> None:
        """A warning the first time ``topic`` goes wrong for this cache, INFO after that:
        one broken cache logs one warning, not one per graph."""
        level = logging.INFO if topic in self._warned else logging.WARNING
        self._warned.add(topic)
        log.log(level, message, *args)

    def untrusted_reason(self, *, create: bool = True) -> str | None:
        """Why this directory must not be used (None when it may), creating it owner-only.

        Each directory is checked with ``lstat`` (:func:`trust.directory_problem`): the
        cache directory may be a symbolic link of this user's, ``blobs/`` and ``locks/``
        may not be links at all."""
        if self._trust is not False:
            return self._trust  # type: ignore[return-value]
        try:
            reason = trust.directory_problem(self.root, create=create, link_ok=True)
            for sub in (BLOBS_DIR, LOCKS_DIR):
                reason = reason or trust.directory_problem(self.root / sub, create=create)
        except OSError as e:
            reason = f"{self.root} cannot be used ({e.strerror or e})"
        self._trust = reason
        return reason

    def usable(self) -> bool:
        """Whether the directory is trusted; warns (once) and returns False when not. The
        first time it is, stale temporary files are removed (:mod:`fxcodegen.cache.files`)."""
        reason = self.untrusted_reason()
        if reason is not None:
            self._warn_once(
                "untrusted",
                "fxcodegen cache: not using %s: %s; compiling without it",
                self.root,
                reason,
            )
            return False
        if not self._temps_swept:
            self._temps_swept = True
            files.first_use(self.root)  # marks it a cache, removes stale temporary files
        return True

    # locking
    @contextlib.contextmanager
    def locked(self, key: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the per-key lock (an exclusive ``filelock.FileLock`` on ``locks/<key>.lock``).

        Raises ``filelock.Timeout`` after ``timeout`` seconds (default ``lock_timeout``), and
        :class:`LockUnavailable` (a ``filelock.Timeout``, warned once) when the lock file
        cannot be used at all.
        """
        _check_key(key)
        path = self.lock_path(key)
        try:
            # Whatever filelock's version does with it, a link or a directory in the lock
            # file's place is never opened (a link would lead the open elsewhere).
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    raise trust.UnsafeFileError(path, f"{trust.kind_of(st)}, not a lock file")
            lock = filelock.FileLock(
                path, timeout=self.lock_timeout if timeout is None else timeout, mode=0o600
            )
            lock.acquire()
        except filelock.Timeout:
            raise
        except Exception as e:  # any failure of the lock is a cache problem
            reason = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
            self._warn_once(
                "lock",
                "fxcodegen cache: cannot take the lock %s (%s); compiling without the cache",
                path,
                reason,
            )
            raise LockUnavailable(str(path), reason) from e
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.release()

    # reading
    def load(self, key: str, factors: Mapping[str, Any] | None = None) -> Artifact | None:
        """The artifact stored under ``key``, or None (a miss). Never raises on damage:
        a damaged, unreadable, untrusted or unknown-version artifact is logged and missed.
        With ``factors``, a miss on an absent artifact logs which factors differ from the
        nearest one (:meth:`explain_miss`)."""
        _check_key(key)
        if not self.usable():
            return None
        t0 = time.perf_counter()
        path = self.artifact_path(key)
        try:
            raw, _ = trust.read_file(path)
        except FileNotFoundError:
            if factors is not None:
                log.info("%s", self.explain_miss(key, factors))
            return None
        except trust.UnsafeFileError as e:
            log.warning(
                "fxcodegen cache: not reading %s: %s; compiling without it", path, e.strerror
            )
            return None
        except OSError as e:
            log.warning(
                "fxcodegen cache: ignoring %s: unreadable (%s); compiling afresh",
                path,
                e.strerror or e,
            )
            return None
        try:
            art = decode_artifact(path, raw, self.root / BLOBS_DIR, expected_key=key)
        except CacheError as e:
            log.warning(
                "fxcodegen cache: ignoring unusable artifact %s: %s; compiling afresh",
                e.path,
                e.reason,
            )
            return None
        log.info(
            "fxcodegen cache: loaded %s (%d pieces, %d entries, code from %s) in %.3fs",
            key[:16],
            len(art.pieces),
            art.num_entries,
            art.code_origin,
            time.perf_counter() - t0,
        )
        return art

    # writing
    def store(self, key: str, factors: Mapping[str, Any], artifact: Artifact) -> Path | None:
        """Write ``artifact`` under ``key`` atomically (blobs first, artifact last) and
        return its path; on any failure log a warning (once) and return None, leaving no
        blob or factors file of this store behind. The first store of a :class:`Cache`
        first removes leftovers (:meth:`sweep`)."""
        _check_key(key)
        if not self.usable():
            return None
        try:
            data, blobs = encode_artifact(artifact, key, factors)
        except Exception as e:  # e.g. a pool that does not pickle
            log.warning(
                "fxcodegen cache: not storing %s: cannot serialize it (%s: %s)",
                key[:16],
                type(e).__name__,
                e,
            )
            return None
        if not self._swept:
            self._swept = True
            self.sweep()
        written: list[tuple[Path, os.stat_result]] = []
        try:
            for digest, blob in blobs.items():
                st = self._store_blob(digest, blob)
                if st is not None:
                    written.append((self.blob_path(digest), st))
            doc = {"key": key, "format": FORMAT_VERSION, "factors": canonical(dict(factors))}
            text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
            files.atomic_write(self.factors_path(key), text.encode())
            path = self.artifact_path(key)
            files.atomic_write(path, data)
        except OSError as e:
            self._undo_store(key, written)
            self._warn_once(
                "write", "fxcodegen cache: could not write %s: %s; not stored", key[:16], e
            )
            return None
        log.info("fxcodegen cache: stored %s (%d bytes, %d blobs)", key[:16], len(data), len(blobs))
        return path

    def _store_blob(self, digest: str, data: bytes) -> os.stat_result | None:
        """Write the blob unless it is stored intact; the written file's stat, or None when
        an existing one was reused (its time is refreshed: it is not an orphan)."""
        path = self.blob_path(digest)
        try:
            decode_blob(path, read_trusted(path, "blob"), digest)
        except CacheError:  # absent, damaged or untrusted: (re)write it
            return files.atomic_write(path, encode_blob(data))
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(path, follow_symlinks=False)
        return None

    def _undo_store(self, key: str, written: list[tuple[Path, os.stat_result]]) -> None:
        """After a failed store (a full disk): remove its factors file unless an artifact is
        there, and each blob it wrote that no other store has reused since."""
        if not os.path.lexists(self.artifact_path(key)):
            with contextlib.suppress(OSError):
                self.factors_path(key).unlink()
        for path, st in written:
            with contextlib.suppress(OSError):
                now = os.lstat(path)
                if os.path.samestat(now, st) and now.st_mtime_ns == st.st_mtime_ns:
                    os.unlink(path)

    # leftovers
    def sweep(self) -> list[Path]:
        """Remove what dead or failed writers left (the rules are in
        :mod:`fxcodegen.cache.files`): stale temporary files, and factors files without
        their artifact and unreferenced blobs older than ``files.ORPHAN_GRACE_S``;
        unreferenced blobs only when every artifact could be read. Returns the paths
        removed; never raises."""
        if self.untrusted_reason(create=False) is not None:
            return []
        try:
            removed = files.stale_temps(self.root, remove=True)
            removed += files.unlink(files.orphans(self.root, contents.referenced_blobs(self.root)))
        except OSError as e:
            log.info("fxcodegen cache: could not remove leftovers in %s: %s", self.root, e)
            return []
        if removed:
            log.info("fxcodegen cache: removed %d leftover file(s) in %s", len(removed), self.root)
        return removed

    # what the directory holds (read-only: :mod:`fxcodegen.cache.contents`)
    def explain_miss(self, key: str, factors: Mapping[str, Any]) -> str:
        """A line saying why ``key`` missed: the factors that differ from the nearest
        stored artifact."""
        return contents.explain_miss(self.root, key, factors)

    def keys(self) -> list[str]:
        return contents.keys(self.root)

    def find(self, prefix: str) -> str:
        """The one stored key starting with ``prefix`` (KeyError if none or several)."""
        return contents.find(self.root, prefix)

    def read_meta(self, key: str) -> dict[str, Any]:
        """The artifact's checksum-verified metadata, read without unpickling or
        unmarshaling anything. Raises :class:`CacheError`."""
        return contents.stored_meta(self.root, key)

    def info(self, key: str) -> StoredInfo:
        """Sizes, pieces, entries and factors of one artifact, read without unpickling."""
        return contents.info(self.root, key)

    def verify(self) -> list[tuple[Path, str]]:
        """Every problem found, as ``(path, reason)`` (:func:`contents.verify`): the
        directory's trust, checksums, permissions, missing blobs, and the leftovers
        :meth:`sweep` removes. Unpickles nothing; changes nothing."""
        return contents.verify(self.root, self.untrusted_reason(create=False))

    def clear(self) -> int:
        """Remove every artifact, factors file, blob, lock, entry reference and temporary
        file (:func:`files.clear`: only the cache's own names, only in a marked, trusted
        cache directory; else :class:`CacheError`); the count."""
        return files.clear(self.root)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
