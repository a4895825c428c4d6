"""The fleet-wide artifact store on Redis, behind the local cache.

Everything the remote store holds is **signed**: a value is ``b"FXCGSIG1"``, then
HMAC-SHA256 over the Redis key name and the payload under a shared secret, then the payload.
A value whose signature does not verify (``hmac.compare_digest``) is never decoded, let
alone unpickled: it is logged and treated as a miss, and the next store replaces it. The
key name is part of what is signed, so a valid value copied under another key fails too.
Without a secret the remote store is not used at all (a WARNING says why).

Keys (``PREFIX`` = ``fxcg:v2:``) live under a **namespace** ``<fingerprint>:``, a hash of
the secret that does not reveal it. Processes with different secrets therefore never read
or overwrite each other's objects, and a value that fails its signature inside a
namespace is damage (or forgery), which the next process that has the object replaces.
None holds a path, a host or a rank:

- ``art:<graph key>``: the artifact file's bytes, exactly as in the local cache;
- ``blob:<sha256>``: one compiled piece-entry (the blob file's content);
- ``entry:<entry key>``: the sha256 of the blob holding that entry (cooperative compile);
- ``claim:<entry key>``: a random token while a process compiles that entry
  (``SET NX PX``, renewed while compiling, released with a compare-and-delete).

Faults never fail a model. Every Redis call has a deadline (``timeout``) for the whole
operation, not only for each socket read, and a process spends at most ``budget`` seconds
in Redis calls in all; an error, a missed deadline, an exhausted budget or a malformed
reply is logged once as a WARNING and switches the store off for the rest of the process.
The caller goes on with the local cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from fxcodegen.cache.format import CacheError, read_meta
from fxcodegen.cache.layout import KEY_RE
from fxcodegen.cache.options import (
    MAX_TIMEOUT_S,
    check_seconds,
    check_secret,
    check_url,
    redacted,
)
from fxcodegen.cache.signing import fingerprint, sign, unsign

__all__ = [
    "BUDGET_FACTOR",
    "CLAIM_TTL_S",
    "DEFAULT_TIMEOUT_S",
    "PREFIX",
    "SECRET_ENV",
    "URL_ENV",
    "Claim",
    "RemoteError",
    "RemoteStore",
    "RemoteTimeout",
    "fingerprint",
    "open_remote",
    "resolve_secret",
    "sign",
    "unsign",
]

log = logging.getLogger("fxcodegen")

URL_ENV = "FXCODEGEN_REMOTE_CACHE"
SECRET_ENV = "FXCODEGEN_CACHE_SECRET"
PREFIX = "fxcg:v2:"
DEFAULT_TIMEOUT_S = 2.0
"""Default deadline of every Redis operation (connecting included), start to end."""
BUDGET_FACTOR = 15
"""A process spends at most this many times ``timeout`` in Redis calls in all (30 s by
default): a server that answers every call just inside the deadline is switched off too."""
CLAIM_TTL_S = 30.0
"""How long an entry claim lives without renewal: a claimer that dies frees its entries
after at most this long. A live claimer renews it every third of it."""

# Delete (or extend) a claim only while it still holds our token.
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
# The SHA-1 of each stored value ('' when absent): whether a stored value is exactly the
# one this process would write, without transferring it.
_DIGESTS = (
    "local out = {} for i, k in ipairs(KEYS) do local v = redis.call('get', k) "
    "if v then out[i] = redis.sha1hex(v) else out[i] = '' end end return out"
)
_NONE = type(None)
# What each command may answer (after redis-py's parsing); anything else is a fault.
_REPLIES: dict[str, tuple[type, ...]] = {
    "ping": (bool,),
    "get": (bytes, _NONE),
    "set": (bool, _NONE),
    "exists": (int,),
    "delete": (int,),
    "eval": (int, bytes, list, _NONE),
    "scan": (tuple, list),
}


class RemoteError(Exception):
    """A Redis call that got a reply of the wrong form, or missed its deadline."""


class RemoteTimeout(RemoteError):
    """A Redis call not finished within its deadline, or past the process's budget."""


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError(
            "remote_cache needs the redis client: pip install 'fxcodegen[remote]' (redis>=5)"
        ) from None
    return redis


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
    """Signed objects in one Redis database. Never raises on a Redis fault: see the module.

    ``secret`` None is for the tools that only list or remove objects."""

    def __init__(
        self,
        url: str,
        secret: bytes | None,
        *,
        timeout: float | None = None,
        claim_ttl: float | None = None,
        budget: float | None = None,
    ) -> None:
        redis = _redis_module()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = check_url(url)
        self.secret = None if secret is None else check_secret(secret)
        self.timeout = check_seconds(
            timeout, "remote_timeout", default=DEFAULT_TIMEOUT_S, upper=MAX_TIMEOUT_S
        )
        self.claim_ttl = check_seconds(claim_ttl, "claim_ttl", default=CLAIM_TTL_S, upper=None)
        self.budget = check_seconds(
            budget, "budget", default=BUDGET_FACTOR * self.timeout, upper=None
        )
        self.namespace = PREFIX + (fingerprint(self.secret) + ":" if self.secret else "")
        """The prefix of this secret's keys (without a secret: of every fxcodegen key)."""
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry_on_timeout=False,
            retry=Retry(NoBackoff(), 0),  # one try: the deadline bounds a call
        )
        self._faults = (redis.RedisError, OSError)
        self.down: str | None = None
        """Why the store was switched off (None while it is in use)."""
        self.spent = 0.0
        """Seconds spent in Redis calls so far (see ``budget``)."""
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteStore({redacted(self.url)!r})"

    def name(self, kind: str, ident: str) -> str:
        """The Redis key of an object of this store's namespace."""
        return f"{self.namespace}{kind}:{ident}"

    # calls
    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.method(*args, **kwargs)`` finished within ``timeout`` (and what is left
        of ``budget``), its reply of the expected form. Raises the client's errors, and
        :class:`RemoteError` for a missed deadline or a malformed reply.

        The call runs in a daemon thread: redis-py bounds each socket read, not a whole
        reply, so a server that drips a reply one byte at a time is cut off here; the
        connections are then shut down, which ends the thread's read."""
        limit = min(self.timeout, max(self.budget - self.spent, 0.0))
        if limit <= 0:
            raise RemoteTimeout(
                f"Redis calls took {self.spent:.1f}s in all (budget {self.budget:g}s)"
            )
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        fn = getattr(self.client, method)

        def target() -> None:
            try:
                box.append((True, fn(*args, **kwargs)))
            except BaseException as e:  # handed to the caller
                box.append((False, e))
            finally:
                done.set()

        t0 = time.monotonic()
        threading.Thread(target=target, daemon=True, name="fxcodegen-redis").start()
        finished = done.wait(limit)
        with self._lock:
            self.spent += time.monotonic() - t0
        if not finished:
            self.client.connection_pool.disconnect()
            if limit < self.timeout:
                raise RemoteTimeout(
                    f"Redis calls took {self.spent:.1f}s in all (budget {self.budget:g}s)"
                )
            raise RemoteTimeout(f"no complete answer to {method.upper()} within {limit:.1f}s")
        ok, value = box[0]
        if not ok:
            if isinstance(value, self._faults):
                raise value
            raise RemoteError(
                f"malformed reply to {method.upper()} ({type(value).__name__}: {value})"
            ) from value
        if not isinstance(value, _REPLIES.get(method, (object,))):
            raise RemoteError(f"malformed reply to {method.upper()}: {type(value).__name__}")
        return value

    def warn_once(self, topic: str, message: str, *args: Any) -> None:
        with self._lock:
            level = logging.INFO if topic in self._warned else logging.WARNING
            self._warned.add(topic)
        log.log(level, message, *args)

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`run`; None after logging (once) and switching the store off when Redis
        fails, is too slow or answers nonsense."""
        if self.down is not None:
            return None
        try:
            return self.run(method, *args, **kwargs)
        except (*self._faults, RemoteError) as e:
            with self._lock:
                if self.down is None:
                    self.down = f"{type(e).__name__}: {e}"
            self.warn_once(
                "down",
                "fxcodegen cache: remote store %s failed (%s: %s, while trying to %s); "
                "going on with the local cache only",
                redacted(self.url),
                type(e).__name__,
                e,
                what,
            )
            return None

    def available(self) -> bool:
        """Whether the store answers (a PING within the timeout); logs once when not."""
        return self.down is None and self.call("connect", "ping") is not None

    # signed values
    def _secret(self) -> bytes:
        if self.secret is None:
            raise ValueError("this RemoteStore has no secret: it cannot sign or check values")
        return self.secret

    def get(self, kind: str, ident: str) -> bytes | None:
        """The verified payload under ``kind:ident``, or None: absent, unreachable, or a
        bad signature (logged)."""
        name = self.name(kind, ident)
        value = self.call(f"read {kind}", "get", name)
        if value is None:
            return None
        payload = unsign(self._secret(), name, value)
        if payload is None:
            self.warn_once(
                f"signature:{name}",
                "fxcodegen cache: remote %s %s has a bad signature (truncated or altered); "
                "not using it, compiling and replacing it",
                kind,
                ident[:16],
            )
        return payload

    def put(self, kind: str, ident: str, payload: bytes) -> bool:
        name = self.name(kind, ident)
        value = sign(self._secret(), name, payload)
        return self.call(f"write {kind}", "set", name, value) is not None

    def stale(self, kind: str, payloads: Mapping[str, bytes]) -> list[str]:
        """Those of ``payloads`` (``{ident: payload}``) whose stored value is not exactly the
        signed value this process would write: absent, damaged, or forged. Compares SHA-1
        digests computed by the server, so no value is transferred. The store being off
        counts as nothing stale (nothing is written then)."""
        idents = list(payloads)
        out: list[str] = []
        for i in range(0, len(idents), 200):
            chunk = idents[i : i + 200]
            names = [self.name(kind, ident) for ident in chunk]
            digests = self.call(f"look up {kind}", "eval", _DIGESTS, len(names), *names)
            if not isinstance(digests, list) or len(digests) != len(names):
                return out if digests is None else idents  # off; or a reply of no use
            for ident, name, got in zip(chunk, names, digests, strict=True):
                want = hashlib.sha1(sign(self._secret(), name, payloads[ident])).hexdigest()
                if not isinstance(got, bytes) or got.decode("ascii", "replace") != want:
                    out.append(ident)
        return out

    # claims
    def claim(self, entry_key: str) -> Claim | bool | None:
        """A :class:`Claim` on the entry; False when another process holds it; None when
        the store is off (claim locally only)."""
        name = self.name("claim", entry_key)
        token = secrets.token_hex(16)
        ok = self.call("claim an entry", "set", name, token, px=int(self.claim_ttl * 1000), nx=True)
        if ok is None:
            return None if self.down is not None else False
        return Claim(self, name, token)

    # tools: these raise (RemoteError, the client's errors) instead of switching off
    def scan(self, kind: str = "*", *, every_namespace: bool = False) -> Iterator[str]:
        """The names of stored objects of ``kind`` (``art``, ``blob``, ``entry``, ``claim``
        or ``*``) in this store's namespace, or in every namespace (always without a
        secret)."""
        every = every_namespace or self.secret is None
        match = f"{PREFIX}*:{kind}:*" if every else f"{self.namespace}{kind}:*"
        cursor: Any = 0
        while True:
            reply = self.run("scan", cursor, match=match, count=500)
            if len(reply) != 2 or not isinstance(reply[1], list):
                raise RemoteError(f"malformed reply to SCAN: {reply!r:.80}")
            cursor, names = reply
            for name in names:
                if not isinstance(name, bytes):
                    raise RemoteError(f"malformed key in a SCAN reply: {name!r:.80}")
                yield name.decode("utf-8", "replace")
            if cursor in (0, b"0", "0"):
                return

    def verify_name(self, name: str) -> str | None:
        """Why the object ``name`` of this namespace is bad, or None: its signature and then
        its own checksum (artifact header and payload SHA-256, blob SHA-256, entry reference
        form). Nothing is unpickled."""
        value = self.run("get", name)
        if value is None:
            return None  # removed meanwhile
        kind, _, ident = name[len(self.namespace) :].partition(":")
        if kind == "claim":
            return None
        if not KEY_RE.match(ident):
            return "not an fxcodegen key"
        payload = unsign(self._secret(), name, value)
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
        """Remove every fxcodegen object (all namespaces); the count."""
        names = list(self.scan(every_namespace=True))
        for i in range(0, len(names), 500):
            self.run("delete", *names[i : i + 500])
        return len(names)


def resolve_secret(cache_secret: Any) -> bytes | None:
    """``cache_secret`` (default ``$FXCODEGEN_CACHE_SECRET``) checked
    (:func:`~fxcodegen.cache.options.check_secret`), or None when neither is set."""
    if cache_secret is not None:
        return check_secret(cache_secret, "cache_secret")
    env = os.environ.get(SECRET_ENV)
    return check_secret(env, SECRET_ENV) if env else None


def open_remote(
    url: str | None,
    cache_secret: str | bytes | None = None,
    *,
    timeout: float | None = None,
    claim_ttl: float | None = None,
) -> RemoteStore | None:
    """The remote store for ``url`` (default ``$FXCODEGEN_REMOTE_CACHE``), or None: no URL,
    or no secret (WARNING: an unsigned store would let anyone who can write to Redis run code
    in every process that reads it). Every argument given is checked, whether or not a URL
    is: ``TypeError``/``ValueError`` naming it. Raises ImportError without redis-py."""
    if url is not None:
        check_url(url)
    if cache_secret is not None:
        check_secret(cache_secret, "cache_secret")
    check_seconds(timeout, "remote_timeout", default=DEFAULT_TIMEOUT_S, upper=MAX_TIMEOUT_S)
    if url is None:
        url = os.environ.get(URL_ENV) or None
        if url is None:
            return None
        check_url(url, URL_ENV)
    secret = resolve_secret(cache_secret)
    if secret is None:
        log.warning(
            "fxcodegen cache: not using the remote store %s: no shared secret to sign and "
            "check its objects (set %s or cache_secret=); an unsigned store would let anyone "
            "who can write to it run code here",
            redacted(url),
            SECRET_ENV,
        )
        return None
    return RemoteStore(url, secret, timeout=timeout, claim_ttl=claim_ttl)
