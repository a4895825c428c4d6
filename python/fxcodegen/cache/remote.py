"""The fleet-wide artifact store on Redis, behind the local cache.

Everything the remote store holds is **signed**: a value is ``b"FXCGSIG1"``, then
HMAC-SHA256 over the Redis key name and the payload under a shared secret, then the payload.
A value whose signature does not verify (``hmac.compare_digest``) is never decoded, let
alone unpickled: it is logged and treated as a miss, and the next store replaces it. The
key name is part of what is signed, so a valid value copied under another key fails too.
Without a secret the remote store is not used at all (a WARNING says why).

Keys (``PREFIX`` = ``fxcg:v1:``), none holding a path, a host or a rank:

- ``art:<graph key>``: the artifact file's bytes, exactly as in the local cache;
- ``blob:<sha256>``: one compiled piece-entry (the blob file's content);
- ``entry:<entry key>``: the sha256 of the blob holding that entry (cooperative compile);
- ``claim:<entry key>``: a random token while a process compiles that entry
  (``SET NX PX``, renewed while compiling, released with a compare-and-delete).

Faults never fail a model: any Redis error or timeout (``timeout``, seconds, bounds every
socket operation) is logged once as a WARNING and the store is switched off for the rest of
the process; the caller goes on with the local cache.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from typing import Any

from fxcodegen.cache.format import KEY_RE, CacheError, read_meta

__all__ = [
    "CLAIM_TTL_S",
    "DEFAULT_TIMEOUT_S",
    "PREFIX",
    "SECRET_ENV",
    "URL_ENV",
    "Claim",
    "RemoteStore",
    "open_remote",
    "sign",
    "unsign",
]

log = logging.getLogger("fxcodegen")

URL_ENV = "FXCODEGEN_REMOTE_CACHE"
SECRET_ENV = "FXCODEGEN_CACHE_SECRET"
PREFIX = "fxcg:v1:"
SIG_MAGIC = b"FXCGSIG1"
_SIG_LEN = 32
DEFAULT_TIMEOUT_S = 2.0
"""Default bound on every Redis socket operation (connect, read, write)."""
MAX_TIMEOUT_S = 60.0
CLAIM_TTL_S = 30.0
"""How long an entry claim lives without renewal: a claimer that dies frees its entries
after at most this long. A live claimer renews it every third of it."""

# Delete (or extend) a claim only while it still holds our token.
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"


def sign(secret: bytes, name: str, payload: bytes) -> bytes:
    """The signed value stored under the Redis key ``name``."""
    mac = hmac.new(secret, name.encode() + b"\x00" + payload, hashlib.sha256).digest()
    return SIG_MAGIC + mac + payload


def unsign(secret: bytes, name: str, value: bytes) -> bytes | None:
    """The payload of a signed value, or None when it is not signed under ``secret`` for
    the key ``name`` (truncated, altered, moved from another key, or foreign)."""
    head = len(SIG_MAGIC) + _SIG_LEN
    if not isinstance(value, bytes) or len(value) < head or not value.startswith(SIG_MAGIC):
        return None
    payload = value[head:]
    mac = hmac.new(secret, name.encode() + b"\x00" + payload, hashlib.sha256).digest()
    return payload if hmac.compare_digest(mac, value[len(SIG_MAGIC) : head]) else None


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError(
            "remote_cache needs the redis client: pip install 'fxcodegen[remote]' (redis>=5)"
        ) from None
    return redis


def _check_timeout(timeout: float | None) -> float:
    t = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
    if not 0 < t <= MAX_TIMEOUT_S:
        raise ValueError(f"remote_timeout must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {t!r}")
    return t


def _redacted(url: str) -> str:
    """The URL without a password (logs must not carry it)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return f"{scheme}{sep}{rest}"


class Claim:
    """An entry claim held in Redis, renewed by a small thread until released."""

    def __init__(self, store: RemoteStore, name: str, token: str) -> None:
        self.store = store
        self.name = name
        self.token = token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="fxcodegen-claim")
        self._thread.start()

    def _renew(self) -> None:
        ttl_ms = int(self.store.claim_ttl * 1000)
        while not self._stop.wait(self.store.claim_ttl / 3):
            if (
                self.store.call("renew a claim", "eval", _RENEW, 1, self.name, self.token, ttl_ms)
                is None
            ):
                return

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.store.timeout * 2)
        self.store.call("release a claim", "eval", _RELEASE, 1, self.name, self.token)


class RemoteStore:
    """Signed objects in one Redis database. Never raises on a Redis fault: see the module."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        *,
        timeout: float | None = None,
        claim_ttl: float | None = None,
    ) -> None:
        redis = _redis_module()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.secret = secret
        self.timeout = _check_timeout(timeout)
        self.claim_ttl = CLAIM_TTL_S if claim_ttl is None else float(claim_ttl)
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry_on_timeout=False,
            retry=Retry(NoBackoff(), 0),  # one try: the timeout alone bounds a call
        )
        self._errors = (redis.RedisError, OSError)
        self.down: str | None = None
        """Why the store was switched off (None while it is in use)."""
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._bad: set[str] = set()
        """Names whose value failed its signature here: written again, never skipped."""

    def __repr__(self) -> str:
        return f"RemoteStore({_redacted(self.url)!r})"

    # faults
    def warn_once(self, topic: str, message: str, *args: Any) -> None:
        with self._lock:
            level = logging.INFO if topic in self._warned else logging.WARNING
            self._warned.add(topic)
        log.log(level, message, *args)

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.method(*args, **kwargs)``; None after logging (once) and switching the
        store off when Redis fails or is too slow."""
        if self.down is not None:
            return None
        try:
            return getattr(self.client, method)(*args, **kwargs)
        except self._errors as e:
            with self._lock:
                if self.down is None:
                    self.down = f"{type(e).__name__}: {e}"
            self.warn_once(
                "down",
                "fxcodegen cache: remote store %s failed (%s: %s, while trying to %s); "
                "going on with the local cache only",
                _redacted(self.url),
                type(e).__name__,
                e,
                what,
            )
            return None

    def available(self) -> bool:
        """Whether the store answers (a PING within the timeout); logs once when not."""
        return self.down is None and self.call("connect", "ping") is not None

    # signed values
    def get(self, kind: str, ident: str) -> bytes | None:
        """The verified payload under ``kind:ident``, or None: absent, unreachable, or a
        bad signature (logged)."""
        name = PREFIX + f"{kind}:{ident}"
        value = self.call(f"read {kind}", "get", name)
        if value is None:
            return None
        payload = unsign(self.secret, name, value)
        if payload is None:
            with self._lock:
                self._bad.add(name)
            self.warn_once(
                f"signature:{name}",
                "fxcodegen cache: remote %s %s has a bad signature (truncated, altered or "
                "signed with another secret); not using it, compiling and replacing it",
                kind,
                ident[:16],
            )
        return payload

    def put(self, kind: str, ident: str, payload: bytes) -> bool:
        name = PREFIX + f"{kind}:{ident}"
        ok = self.call(f"write {kind}", "set", name, sign(self.secret, name, payload)) is not None
        if ok:
            with self._lock:
                self._bad.discard(name)
        return ok

    def missing(self, kind: str, idents: list[str]) -> list[str]:
        """Those of ``idents`` not stored, or found with a bad signature by this process
        (so that they are written again). Checks existence only: no value is transferred."""
        out = []
        for ident in idents:
            name = PREFIX + f"{kind}:{ident}"
            if name in self._bad or not self.call(f"look up {kind}", "exists", name):
                out.append(ident)
        return out

    # claims
    def claim(self, entry_key: str) -> Claim | bool | None:
        """A :class:`Claim` on the entry; False when another process holds it; None when
        the store is off (claim locally only)."""
        name = PREFIX + f"claim:{entry_key}"
        token = secrets.token_hex(16)
        ok = self.call("claim an entry", "set", name, token, px=int(self.claim_ttl * 1000), nx=True)
        if ok is None:
            return None if self.down is not None else False
        return Claim(self, name, token)

    # tools
    def scan(self, kind: str = "*") -> Iterator[str]:
        """The names of stored objects of ``kind`` (``art``, ``blob``, ``entry``, ``claim``
        or ``*``)."""
        for name in self.client.scan_iter(match=f"{PREFIX}{kind}:*", count=500):
            yield name.decode() if isinstance(name, bytes) else str(name)

    def verify_name(self, name: str) -> str | None:
        """Why the object ``name`` is bad, or None: its signature and then its own checksum
        (artifact header and payload SHA-256, blob SHA-256, entry reference form). Nothing is
        unpickled. Raises on Redis errors (tools report them)."""
        value = self.client.get(name)
        if value is None:
            return None  # removed meanwhile
        kind, _, ident = name[len(PREFIX) :].partition(":")
        if kind == "claim":
            return None
        if not KEY_RE.match(ident):
            return "not an fxcodegen key"
        payload = unsign(self.secret, name, value)
        if payload is None:
            return "bad signature"
        if kind == "art":
            try:
                _, _, meta = read_meta(name, payload)  # type: ignore[arg-type]
            except CacheError as e:
                return e.reason
            if meta["key"] != ident:
                return f"holds key {meta['key'][:16]}"
        elif kind == "blob":
            if hashlib.sha256(payload).hexdigest() != ident:
                return "blob checksum mismatch"
        elif kind == "entry":
            if not KEY_RE.match(payload.decode("ascii", "replace")):
                return "malformed entry reference"
        else:
            return f"unknown kind {kind!r}"
        return None

    def clear(self) -> int:
        names = list(self.scan())
        for i in range(0, len(names), 500):
            self.client.delete(*names[i : i + 500])
        return len(names)


def resolve_secret(cache_secret: str | bytes | None) -> bytes | None:
    if cache_secret is None:
        cache_secret = os.environ.get(SECRET_ENV) or None
    if cache_secret is None:
        return None
    return cache_secret.encode() if isinstance(cache_secret, str) else bytes(cache_secret)


def open_remote(
    url: str | None,
    cache_secret: str | bytes | None = None,
    *,
    timeout: float | None = None,
    claim_ttl: float | None = None,
) -> RemoteStore | None:
    """The remote store for ``url`` (default ``$FXCODEGEN_REMOTE_CACHE``), or None: no URL,
    or no secret (WARNING: an unsigned store would let anyone who can write to Redis run code
    in every process that reads it). Raises ImportError without redis-py, ValueError for a
    bad URL or timeout."""
    url = url or os.environ.get(URL_ENV) or None
    if url is None:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"remote_cache must be a redis:// URL, got {_redacted(url)!r}")
    secret = resolve_secret(cache_secret)
    if not secret:
        log.warning(
            "fxcodegen cache: not using the remote store %s: no shared secret to sign and "
            "check its objects (set %s or cache_secret=); an unsigned store would let anyone "
            "who can write to it run code here",
            _redacted(url),
            SECRET_ENV,
        )
        return None
    return RemoteStore(url, secret, timeout=timeout, claim_ttl=claim_ttl)
