"""Cooperative cold start: processes that compile the same graph at the same time split the
work piece-entry by piece-entry, on one machine (a shared cache directory) and across
machines (a shared :class:`~fxcodegen.cache.remote.RemoteStore`).

Each process walks the graph's distinct piece-entries in the same order. For each entry it
first looks for a stored result (``entries/<entry key>`` in the cache directory names the
blob holding it; then the remote store), else tries to **claim** it: a non-blocking lock on
``locks/<entry key>.lock`` (``filelock``; the kernel releases it when its holder dies) and,
with a remote store, ``SET claim:<entry key> NX PX`` in Redis (expires unless renewed, so a
dead claimer's claim lapses). The claimer compiles the entry, stores it (blob, reference,
remote copy) and releases the claim; an entry claimed by another process is skipped and
picked up on a later pass once stored. Passes repeat every :data:`POLL_S` until every entry
is in hand. Nothing waits forever: a :class:`Coop` (one per backend, so one per cold start)
waits at most :data:`WAIT_S` seconds in all, over all its graphs, for entries other
processes hold; then it compiles them itself (a WARNING says so). While it waits it says
which entry it waits for and which process holds it (a WARNING after :data:`WARN_S`).

A graph artifact found in the remote store but not in the cache directory is copied into it
first (:meth:`Coop.fill`), so a replica with an empty disk warm-starts from Redis alone; an
artifact stored locally is published to the remote store (:meth:`Coop.publish`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock

from fxcodegen.cache import files, trust
from fxcodegen.cache.artifact import canonical, sha256
from fxcodegen.cache.format import CacheError, decode_blob, encode_blob, read_meta, read_trusted
from fxcodegen.cache.layout import ENTRIES_DIR, FORMAT_VERSION, KEY_RE
from fxcodegen.cache.options import check_seconds
from fxcodegen.cache.remote import Claim, RemoteStore
from fxcodegen.cache.store import Cache, LockUnavailable
from fxcodegen.cache.work import Work

__all__ = [
    "ENTRIES_DIR",
    "POLL_S",
    "WAIT_S",
    "WARN_S",
    "Coop",
    "Work",
    "clear_entries",
    "open_coop",
]

log = logging.getLogger("fxcodegen")

POLL_S = 0.25
"""How often a process looks again for the entries other processes are compiling."""
WAIT_S = 900.0
"""How long a cold start waits in all (over every graph) for entries other processes hold
before it compiles them itself (``backend(claim_wait=...)``)."""
WARN_S = 30.0
"""How long one wait lasts before a WARNING names the entry and the process holding it."""


class Coop:
    """Cooperative compile and the remote level for one local :class:`Cache`."""

    def __init__(
        self,
        cache: Cache,
        remote: RemoteStore | None = None,
        *,
        wait_s: float | None = None,
        poll_s: float | None = None,
        warn_s: float | None = None,
        count: Callable[[str], None] | None = None,
    ) -> None:
        self.cache = cache
        self.remote = remote
        self._count = count or (lambda name: None)
        """Called with ``"remote_loaded"`` or ``"remote_stored"`` for each object read from
        or written to the remote store (the backend counts them in ``fxcodegen.counters``)."""
        self.wait_s = check_seconds(wait_s, "claim_wait", default=WAIT_S, upper=None)
        self.poll_s = POLL_S if poll_s is None else poll_s
        self.warn_s = min(WARN_S, self.wait_s / 4) if warn_s is None else warn_s
        self.waited = 0.0
        """Seconds this cold start has waited for other processes' entries, all graphs."""
        self._gave_up = 0
        self._entries_ok: bool | None = None
        self.read_only = False
        """Set when an entry's lock cannot be taken at all (a read-only cache, warned once
        by the cache): nothing is written to the directory after that."""

    def __repr__(self) -> str:
        return f"Coop({self.cache!r}, {self.remote!r})"

    # local entry references
    def _entries_dir(self) -> Path | None:
        d = self.cache.root / ENTRIES_DIR
        if self._entries_ok is None:
            if not self.cache.usable():  # creates the cache directory owner-only first
                self._entries_ok = False
                return None
            try:
                self._entries_ok = trust.directory_problem(d, create=True) is None
            except OSError:
                self._entries_ok = False
            if not self._entries_ok:
                log.info("fxcodegen cache: %s cannot be used; entries are not shared", d)
        return d if self._entries_ok else None

    def _local_blob(self, digest: str) -> bytes | None:
        path = self.cache.blob_path(digest)
        try:
            return decode_blob(path, read_trusted(path, "blob"), digest)
        except CacheError:
            return None

    def _write_blob(self, digest: str, data: bytes) -> None:
        if self._local_blob(digest) is None:
            files.atomic_write(self.cache.blob_path(digest), encode_blob(data))

    def get_entry(self, key: str) -> bytes | None:
        """The stored result of one entry: locally, else from the remote store (then kept
        locally). Never raises."""
        d = self._entries_dir()
        if d is not None:
            try:
                raw, _ = trust.read_file(d / key, max_bytes=256)
                digest = raw.decode("ascii").strip()
                if KEY_RE.match(digest):
                    data = self._local_blob(digest)
                    if data is not None:
                        return data
            except (OSError, UnicodeDecodeError):
                pass
        if self.remote is None:
            return None
        ref = self.remote.get("entry", key)
        if ref is None:
            return None
        digest = ref.decode("ascii", "replace")
        data = self._local_blob(digest) if KEY_RE.match(digest) else None
        if data is None:
            data = self.remote.get("blob", digest) if KEY_RE.match(digest) else None
            if data is None or sha256(data) != digest:
                return None
        self._count("remote_loaded")
        self._keep_local(key, digest, data)
        return data

    def _keep_local(self, key: str, digest: str, data: bytes) -> None:
        d = None if self.read_only else self._entries_dir()
        if d is None:
            return
        try:
            self._write_blob(digest, data)
            files.atomic_write(d / key, digest.encode() + b"\n")
        except OSError as e:
            log.info("fxcodegen cache: could not keep entry %s: %s", key[:16], e)

    def put_entry(self, key: str, data: bytes) -> None:
        """Store one compiled entry locally and remotely. Never raises."""
        digest = sha256(data)
        self._keep_local(key, digest, data)
        r = self.remote
        if r is not None and r.down is None:
            # Also rewrites a damaged copy: its name, a content hash, does not change.
            if r.stale("blob", {digest: data}) and not r.put("blob", digest, data):
                return
            if r.put("entry", key, digest.encode()):
                self._count("remote_stored")

    @contextlib.contextmanager
    def claim(self, key: str) -> Iterator[bool]:
        """Hold the entry's claim (True), or learn that another process holds it (False).
        A lock that cannot be taken at all (a read-only cache) counts as held: compile."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.cache.locked(key, timeout=0))
            except LockUnavailable:  # warned by the cache; compile, write nothing here
                self.read_only = True
                yield True
                return
            except filelock.Timeout:
                yield False
                return
            held = self.remote.claim(key) if self.remote is not None else None
            if held is False:
                yield False
                return
            if isinstance(held, Claim):
                stack.callback(held.release)
            yield True

    def gather(self, work: list[Work]) -> tuple[dict[str, bytes], set[str]]:
        """Have every entry of ``work`` in hand: ``(bytes of the entries others stored,
        keys compiled here)``. Errors of a compile propagate; cache faults never do."""
        others: dict[str, bytes] = {}
        mine: set[str] = set()
        todo = list(work)
        t_start = time.monotonic()
        waited = 0.0  # in this gather
        say_at = self.warn_s
        while todo:
            t_pass = time.monotonic()
            progressed = False
            for w in list(todo):
                data = self.get_entry(w.key)
                if data is None:
                    with self.claim(w.key) as held:
                        if not held:
                            continue
                        data = self.get_entry(w.key)  # stored while we were claiming
                        if data is None:
                            t0 = time.perf_counter()
                            self.put_entry(w.key, w.compile())
                            mine.add(w.key)
                            log.debug("compiled %s in %.2fs", w.label, time.perf_counter() - t0)
                if data is not None:
                    others[w.key] = data
                todo.remove(w)
                progressed = True
            if not todo or progressed:
                continue
            if self.waited >= self.wait_s:
                self._give_up(todo, mine)
                break
            if waited >= say_at:
                self._say_who(todo, waited, again=say_at > self.warn_s)
                say_at += self.warn_s
            time.sleep(max(0.0, min(self.poll_s, self.wait_s - self.waited)))
            pause = time.monotonic() - t_pass
            self.waited += pause
            waited += pause
        if work:
            log.info(
                "fxcodegen cache: cooperative compile: %d piece-entries compiled here, %d "
                "from other processes, in %.2fs (%.2fs of it waiting for them)",
                len(mine),
                len(others),
                time.monotonic() - t_start,
                waited,
            )
        return others, mine

    def _say_who(self, todo: list[Work], waited: float, *, again: bool) -> None:
        """Which entry this process waits for and who holds it (a frozen claimer is
        otherwise silent): a WARNING, then INFO every ``warn_s``."""
        w = todo[0]
        log.log(
            logging.INFO if again else logging.WARNING,
            "fxcodegen cache: waited %.0fs for %s (entry %s, claimed by %s%s); %d entries "
            "pending; compiling them here after %.0fs more",
            waited,
            w.label,
            w.key[:16],
            files.waiting_on(self.cache.lock_path(w.key)),
            "" if self.remote is None else " or a remote process",
            len(todo),
            max(0.0, self.wait_s - self.waited),
        )

    def _give_up(self, todo: list[Work], mine: set[str]) -> None:
        """Compile here what other processes hold: the cold start's wait is spent."""
        self._gave_up += 1
        log.log(
            logging.WARNING if self._gave_up == 1 else logging.INFO,
            "fxcodegen cache: %d piece-entries claimed by other processes did not arrive "
            "within %.0fs (claim_wait, for the whole cold start); compiling them here",
            len(todo),
            self.wait_s,
        )
        for w in todo:
            self.put_entry(w.key, w.compile())
            mine.add(w.key)

    # the graph artifact and the remote store
    def fill(self, key: str) -> bool:
        """Copy the artifact ``key`` (and the blobs it references) from the remote store
        into the cache directory when the directory lacks it; True when copied."""
        r = self.remote
        if r is None or r.down is not None or not self.cache.usable():
            return False
        if self.cache.artifact_path(key).exists():
            return False
        raw = r.get("art", key)
        if raw is None:
            return False
        try:
            _, _, meta = read_meta(Path(f"remote:{key[:16]}"), raw)
            if meta.get("key") != key:
                raise CacheError(Path(key), "holds another key")
            digests = {ref["blob"] for pm in meta["pieces"] for ref in pm["entries"].values()}
            if not all(isinstance(d, str) and KEY_RE.match(d) for d in digests):
                raise CacheError(Path(key), "bad blob reference")
        except (CacheError, KeyError, TypeError, AttributeError) as e:
            r.warn_once("art-form", "fxcodegen cache: remote artifact %s unusable: %s", key[:16], e)
            return False
        try:
            for digest in sorted(digests):
                if self._local_blob(digest) is not None:
                    continue
                data = r.get("blob", digest)
                if data is None or sha256(data) != digest:
                    return False
                self._write_blob(digest, data)
            doc = {"key": key, "format": FORMAT_VERSION, "factors": canonical(meta["factors"])}
            text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
            files.atomic_write(self.cache.factors_path(key), text.encode())
            files.atomic_write(self.cache.artifact_path(key), raw)
        except OSError as e:
            log.info("fxcodegen cache: could not copy remote artifact %s: %s", key[:16], e)
            return False
        self._count("remote_loaded")
        log.info("fxcodegen cache: copied %s from the remote store", key[:16])
        return True

    def publish(self, key: str, *, force: bool = False) -> bool:
        """Copy the local artifact ``key`` and its blobs to the remote store wherever the
        stored copy is not exactly this one (absent, damaged or forged; compared by digest,
        nothing downloaded). The blobs are checked when the artifact was not intact, or
        always with ``force`` (after a compile). True when anything was written."""
        r = self.remote
        if r is None or r.down is not None:
            return False
        path = self.cache.artifact_path(key)
        try:
            raw, _ = trust.read_file(path)
            _, _, meta = read_meta(path, raw)
            digests = sorted(
                {ref["blob"] for pm in meta["pieces"] for ref in pm["entries"].values()}
            )
        except (OSError, CacheError, KeyError, TypeError, AttributeError):
            return False
        art_stale = bool(r.stale("art", {key: raw}))
        if not (art_stale or force):
            return False
        blobs = {}
        for digest in digests:
            data = self._local_blob(digest)
            if data is None:
                return False
            blobs[digest] = data
        wrote = False
        for digest in r.stale("blob", blobs):
            if not r.put("blob", digest, blobs[digest]):
                return False
            wrote = True
        if art_stale:
            if not r.put("art", key, raw):
                return False
            self._count("remote_stored")
            wrote = True
        return wrote


def open_coop(
    cache: Cache | None,
    remote: RemoteStore | None,
    *,
    wait_s: float | None = None,
    count: Callable[[str], None] | None = None,
) -> Coop | None:
    """The :class:`Coop` of a backend's cache, or None without a local cache (a remote
    store alone is not used: WARNING). ``wait_s``: the ``claim_wait`` option, checked
    whether or not there is a cache."""
    check_seconds(wait_s, "claim_wait", default=WAIT_S, upper=None)
    if cache is None:
        if remote is not None:
            log.warning(
                "fxcodegen cache: not using the remote store %r: it needs the local cache in "
                "front (cache_dir is off or the compiler stores nothing)",
                remote,
            )
        return None
    return Coop(cache, remote, wait_s=wait_s, count=count)


def clear_entries(root: str | os.PathLike[str]) -> int:
    """Remove the entry references of a cache directory; the count. Only regular files
    named by an entry key (``cache clear`` removes these too, see :func:`files.clear`)."""
    d = Path(root) / ENTRIES_DIR
    if not files.real_dir(d):
        return 0
    names = [n for n in sorted(os.listdir(d)) if KEY_RE.fullmatch(n)]
    return len(
        files.unlink([d / n for n in names if (d / n).is_file() and not (d / n).is_symlink()])
    )
