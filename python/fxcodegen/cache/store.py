"""The local store: a cache directory, its per-key locks, and get-or-create.

Layout of a cache directory (owner-only, see ``docs/cache.md``)::

    DIR/                      0700
      <key>.fxc               0600  the artifact: header + sections (meta, code, consts)
      <key>.factors.json      0600  the key's factors, human-readable
      blobs/<sha256>          0600  one compiled piece-entry, named by the hash of its bytes
      locks/<key>.lock        0600  the per-key lock (``filelock``)

The backend-facing methods of :class:`Cache` (``usable``, ``load``, ``store``,
``get_or_create``) never raise because of the cache: a damaged, hostile, unreadable or
read-only cache is logged on the ``fxcodegen`` logger and treated as a miss, and the graph
is compiled without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from fxcodegen.cache import tidy, trust
from fxcodegen.cache.format import (
    ARTIFACT_SUFFIX,
    BLOBS_DIR,
    FACTORS_SUFFIX,
    FORMAT_VERSION,
    KEY_RE,
    LOCKS_DIR,
    Artifact,
    CacheError,
    canonical,
    decode_artifact,
    decode_blob,
    encode_artifact,
    encode_blob,
    read_meta,
    read_trusted,
)
from fxcodegen.cache.keys import explain_difference
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


@dataclass
class StoredInfo:
    """What :meth:`Cache.info` reports for one artifact file (read without unpickling)."""

    key: str
    path: Path
    size: int
    """Bytes of the artifact file plus the blobs it references."""
    pieces: int = 0
    entries: int = 0
    factors: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


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
        return self.root / f"{key}{ARTIFACT_SUFFIX}"

    def factors_path(self, key: str) -> Path:
        return self.root / f"{key}{FACTORS_SUFFIX}"

    def blob_path(self, digest: str) -> Path:
        return self.root / BLOBS_DIR / digest

    def lock_path(self, key: str) -> Path:
        return self.root / LOCKS_DIR / f"{key}.lock"

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
        first time it is, stale temporary files are removed (:mod:`fxcodegen.cache.tidy`)."""
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
            tidy.first_use(self.root)  # marks it a cache, removes stale temporary files
        return True

    # locking
    def _acquire(self, key: str, timeout: float | None) -> filelock.BaseFileLock:
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
        except Exception as e:  # noqa: BLE001 - any failure of the lock is a cache problem
            reason = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
            self._warn_once(
                "lock",
                "fxcodegen cache: cannot take the lock %s (%s); compiling without the cache",
                path,
                reason,
            )
            raise LockUnavailable(str(path), reason) from e
        return lock

    @contextlib.contextmanager
    def locked(self, key: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the per-key lock (an exclusive ``filelock.FileLock`` on ``locks/<key>.lock``).

        Raises ``filelock.Timeout`` after ``timeout`` seconds (default ``lock_timeout``), and
        :class:`LockUnavailable` (a ``filelock.Timeout``, warned once) when the lock file
        cannot be used at all.
        """
        _check_key(key)
        lock = self._acquire(key, timeout)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.release()

    # reading
    def _load(self, key: str) -> tuple[Artifact | None, Any]:
        """(artifact or None, a signature of the file read: stat identity or None)."""
        path = self.artifact_path(key)
        try:
            raw, st = trust.read_file(path)
        except FileNotFoundError:
            return None, None
        except trust.UnsafeFileError as e:
            log.warning(
                "fxcodegen cache: not reading %s: %s; compiling without it", path, e.strerror
            )
            return None, self._stat_sig(key)[1] or ("unsafe", e.strerror)
        except OSError as e:
            log.warning(
                "fxcodegen cache: ignoring %s: unreadable (%s); compiling afresh",
                path,
                e.strerror or e,
            )
            return None, self._stat_sig(key)[1] or ("unreadable", str(e))
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        try:
            art = decode_artifact(path, raw, self.root / BLOBS_DIR, expected_key=key)
        except CacheError as e:
            log.warning(
                "fxcodegen cache: ignoring unusable artifact %s: %s; compiling afresh",
                e.path,
                e.reason,
            )
            return None, sig
        return art, sig

    def load(self, key: str, factors: Mapping[str, Any] | None = None) -> Artifact | None:
        """The artifact stored under ``key``, or None (a miss). Never raises on damage:
        a damaged, unreadable, untrusted or unknown-version artifact is logged and missed.
        With ``factors``, a miss logs which factors differ from the nearest artifact."""
        _check_key(key)
        if not self.usable():
            return None
        t0 = time.perf_counter()
        art, sig = self._load(key)
        if art is not None:
            log.info(
                "fxcodegen cache: loaded %s (%d pieces, %d entries, code from %s) in %.3fs",
                key[:16],
                len(art.pieces),
                art.num_entries,
                art.code_origin,
                time.perf_counter() - t0,
            )
        elif factors is not None and sig is None:
            log.info("%s", self.explain_miss(key, factors))
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
        except Exception as e:  # noqa: BLE001 - e.g. a pool that does not pickle
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
            tidy.atomic_write(self.factors_path(key), text.encode())
            path = self.artifact_path(key)
            tidy.atomic_write(path, data)
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
            return tidy.atomic_write(path, encode_blob(data))
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

    def get_or_create(
        self, key: str, factors: Mapping[str, Any], create_fn: Callable[[], Artifact]
    ) -> tuple[Artifact, bool]:
        r"""The artifact for ``key``, loaded or made by ``create_fn()`` and stored.

        Returns ``(artifact, loaded)``. Of many processes asking for the same key at once,
        one calls ``create_fn`` (under the key's lock) while the others wait and then load.
        Errors from ``create_fn`` propagate; cache problems never do: a lock not acquired in
        time or not usable at all (a read-only cache) means compiling without the cache.
        A created artifact is prepared (:meth:`Artifact.prepare`), so both paths bind it
        with ``execution_fn``.
        """
        _check_key(key)
        if not self.usable():
            return create_fn().prepare(key, factors), False
        art, sig = self._load(key)
        if art is not None:
            return art, True
        try:
            lock = self._acquire(key, None)
        except LockUnavailable:
            return create_fn().prepare(key, factors), False  # warned by _acquire
        except filelock.Timeout:
            self._warn_once(
                "lock",
                "fxcodegen cache: lock for %s not acquired in %.0fs; compiling without the cache",
                key[:16],
                self.lock_timeout,
            )
            return create_fn().prepare(key, factors), False
        try:
            _, sig2 = self._stat_sig(key)
            if sig2 is not None and sig2 != sig:  # written (or rewritten) meanwhile
                art, sig = self._load(key)
                if art is not None:
                    log.info("fxcodegen cache: loaded %s after waiting", key[:16])
                    return art, True
            if sig is None:
                log.info("%s", self.explain_miss(key, factors))
            art = create_fn().prepare(key, factors)
            if art.storable:
                self.store(key, factors, art)
            else:
                log.info("fxcodegen cache: %s is not storable; not stored", key[:16])
            return art, False
        finally:
            with contextlib.suppress(OSError):
                lock.release()

    def _stat_sig(self, key: str) -> tuple[Path, Any]:
        path = self.artifact_path(key)
        try:
            st = os.lstat(path)
        except OSError:
            return path, None
        return path, (st.st_ino, st.st_size, st.st_mtime_ns)

    # leftovers
    def _referenced_blobs(self) -> set[str] | None:
        """The blobs every artifact references; None when some artifact cannot be read."""
        referenced: set[str] = set()
        for key in self.keys():
            path = self.artifact_path(key)
            try:
                raw, _ = trust.read_file(path)
                _, _, meta = read_meta(path, raw)
                for pm in meta["pieces"]:
                    referenced.update(ref["blob"] for ref in pm["entries"].values())
            except (OSError, CacheError, KeyError, TypeError, AttributeError):
                return None
        return referenced

    def sweep(self) -> list[Path]:
        """Remove what dead or failed writers left (the rules are in
        :mod:`fxcodegen.cache.tidy`): stale temporary files, and factors files without
        their artifact and unreferenced blobs older than ``tidy.ORPHAN_GRACE_S``;
        unreferenced blobs only when every artifact could be read. Returns the paths
        removed; never raises."""
        if self.untrusted_reason(create=False) is not None:
            return []
        try:
            removed = tidy.stale_temps(self.root, remove=True)
            removed += tidy.unlink(tidy.orphans(self.root, self._referenced_blobs()))
        except OSError as e:
            log.info("fxcodegen cache: could not remove leftovers in %s: %s", self.root, e)
            return []
        if removed:
            log.info("fxcodegen cache: removed %d leftover file(s) in %s", len(removed), self.root)
        return removed

    # explaining
    def _all_factors(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for p in sorted(self.root.glob(f"*{FACTORS_SUFFIX}")):
            try:
                raw, _ = trust.read_file(p)
                doc = json.loads(raw)
                yield str(doc["key"]), dict(doc["factors"])
            except (OSError, ValueError, KeyError, TypeError):
                continue

    def explain_miss(self, key: str, factors: Mapping[str, Any]) -> str:
        """A line saying why ``key`` missed: the factors that differ from the nearest
        stored artifact (the one with the fewest differing factors)."""
        mine = canonical(dict(factors))
        best: tuple[int, str, list[str]] | None = None
        for other, theirs in self._all_factors():
            if other == key:
                continue
            diff = explain_difference(mine, theirs)
            if best is None or len(diff) < best[0]:
                best = (len(diff), other, diff)
        head = f"fxcodegen cache: miss for {key[:16]} in {self.root}"
        if best is None:
            return f"{head}: no other artifact to compare with"
        _, other, diff = best
        if not diff:
            return (
                f"{head}: artifact {other[:16]} has the same factors (stored by another key scheme)"
            )
        return f"{head}: nearest artifact {other[:16]} differs in " + "; ".join(diff)

    # tools
    def keys(self) -> list[str]:
        out = []
        for p in sorted(self.root.glob(f"*{ARTIFACT_SUFFIX}")):
            key = p.name[: -len(ARTIFACT_SUFFIX)]
            if KEY_RE.match(key):
                out.append(key)
        return out

    def read_meta(self, key: str) -> dict[str, Any]:
        """The artifact's checksum-verified metadata (``code``, ``factors``, ``pieces``,
        ...), read without unpickling or unmarshaling anything. Raises :class:`CacheError`."""
        path = self.artifact_path(key)
        try:
            raw, _ = trust.read_file(path, owner_only=False)
        except OSError as e:
            raise CacheError(path, f"unreadable ({e.strerror or e})") from None
        return read_meta(path, raw)[2]

    def info(self, key: str) -> StoredInfo:
        """Sizes, pieces, entries and factors of one artifact, read without unpickling."""
        path = self.artifact_path(key)
        info = StoredInfo(key=key, path=path, size=0)
        try:
            raw, _ = trust.read_file(path, owner_only=False)
            info.size = len(raw)
            _, _, meta = read_meta(path, raw)
        except OSError as e:
            info.error = f"unreadable ({e.strerror or e})"
            return info
        except CacheError as e:
            info.error = e.reason
            return info
        info.factors = dict(meta.get("factors") or {})
        info.pieces = len(meta["pieces"])
        digests = set()
        for pm in meta["pieces"]:
            for ref in (pm.get("entries") or {}).values():
                info.entries += 1
                digests.add(ref.get("blob"))
        for d in digests:
            with contextlib.suppress(OSError, TypeError):
                info.size += os.lstat(self.blob_path(d)).st_size
        return info

    def find(self, prefix: str) -> str:
        """The one stored key starting with ``prefix`` (KeyError if none or several)."""
        matches = [k for k in self.keys() if k.startswith(prefix)]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} artifacts match {prefix!r}")
        return matches[0]

    def verify(self) -> list[tuple[Path, str]]:
        """Every problem found, as ``(path, reason)``: checksums of artifacts and blobs,
        permissions, files that are not regular, missing blobs, and the leftovers
        :meth:`sweep` removes (stale temporary files, orphans older than
        :data:`tidy.ORPHAN_GRACE_S`). Unpickles nothing; changes nothing."""
        problems: list[tuple[Path, str]] = []
        reason = self.untrusted_reason(create=False)
        if reason is not None:
            problems.append((self.root, reason))
        referenced: set[str] = set()
        for key in self.keys():
            path = self.artifact_path(key)
            try:
                raw, st = trust.read_file(path, owner_only=False)
                why = trust.owner_only_problem(st)
                if why:
                    problems.append((path, why))
                _, _, meta = read_meta(path, raw)
                if meta["key"] != key:
                    problems.append((path, f"holds key {meta['key'][:16]}…"))
                for pm in meta["pieces"]:
                    for ref in pm["entries"].values():
                        referenced.add(ref["blob"])
            except trust.UnsafeFileError as e:
                problems.append((path, str(e.strerror)))
            except OSError as e:
                problems.append((path, f"unreadable ({e.strerror or e})"))
            except CacheError as e:
                problems.append((e.path, e.reason))
            except (KeyError, TypeError, AttributeError) as e:
                problems.append((path, f"malformed piece metadata: {e!r}"))
        blob_dir = self.root / BLOBS_DIR
        present = set(os.listdir(blob_dir)) if tidy.real_dir(blob_dir) else set()
        for digest in sorted(referenced | present):
            bpath = blob_dir / digest
            if digest.startswith(tidy.TMP_PREFIX):
                continue  # below
            if digest not in present:
                problems.append((bpath, "missing blob"))
                continue
            try:
                raw, st = trust.read_file(bpath, owner_only=False)
                why = trust.owner_only_problem(st)
                if why:
                    problems.append((bpath, why))
                decode_blob(bpath, raw, digest)
            except trust.UnsafeFileError as e:
                problems.append((bpath, str(e.strerror)))
            except OSError as e:
                problems.append((bpath, f"unreadable ({e.strerror or e})"))
            except CacheError as e:
                problems.append((bpath, e.reason))
        for p in tidy.orphans(self.root, referenced):
            what = (
                "unreferenced blob" if p.parent == blob_dir else "factors file without its artifact"
            )
            problems.append((p, what))
        problems += [(p, "stale temporary file") for p in tidy.stale_temps(self.root)]
        return problems

    def clear(self) -> int:
        """Remove every artifact, factors file, blob, lock, entry reference and temporary
        file (:func:`tidy.clear`: only the cache's own names, only in a marked, trusted
        cache directory; else :class:`CacheError`); the count."""
        return tidy.clear(self.root)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
