"""Checks on the cache options a backend takes (``cache_dir``, ``remote_cache``,
``cache_secret``, ``remote_timeout``, ``claim_wait``).

Each check runs whatever the other options are, so a bad value fails when the backend is
made, not later when (or if) the option comes into use. Errors name the option.
"""

from __future__ import annotations

import math
import os
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

__all__ = [
    "MAX_TIMEOUT_S",
    "MIN_SECRET_BYTES",
    "check_cache_dir",
    "check_secret",
    "check_seconds",
    "check_url",
    "redacted",
]

MAX_TIMEOUT_S = 60.0
MIN_SECRET_BYTES = 16
"""A shorter secret can be guessed; HMAC also pads a short key with zero bytes, so a key
of NULs signs exactly like the empty key."""

URL_SCHEMES = ("redis://", "rediss://", "unix://")
# Query parameters of a Redis URL that redis-py lets override the timeouts and retries this
# layer sets: they would unbound the calls that ``remote_timeout`` bounds.
_TIMING_PARAMS = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "timeout",
        "retry_on_timeout",
        "retry_on_error",
        "socket_keepalive",
        "health_check_interval",
    }
)
_SECRET_PARAMS = ("password", "pass", "passwd", "token", "auth")


def check_cache_dir(cache_dir: Any) -> str | bool | None:
    """``cache_dir`` as a backend keeps it: a path string, ``None`` (the default
    directory) or ``False`` (off). ``True`` means the default. An empty path is refused:
    it would make the current directory the cache."""
    if cache_dir is None or cache_dir is True:
        return None
    if cache_dir is False:
        return False
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(
            f"cache_dir must be a path, None or False, got {type(cache_dir).__name__} {cache_dir!r}"
        )
    path = os.fspath(cache_dir)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise ValueError(
            "cache_dir must not be empty (it would make the current directory the cache)"
        )
    return path


def check_seconds(value: Any, name: str, *, default: float, upper: float | None) -> float:
    """``value`` (``None``: ``default``) as seconds in (0, ``upper``]; a ``TypeError`` for
    a non-number, a ``ValueError`` naming ``name`` for anything out of range (nan, inf)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    t = float(value)
    bound = math.inf if upper is None else upper
    if not (math.isfinite(t) and 0 < t <= bound):
        span = f"(0, {upper:g}]" if upper is not None else "a finite number > 0"
        raise ValueError(f"{name} must be {span} seconds, got {value!r}")
    return t


def check_secret(value: Any, name: str = "cache_secret") -> bytes:
    """The secret as bytes. ``str`` (UTF-8) or ``bytes`` only: ``bytes(5)`` would be five
    NUL bytes. At least :data:`MIN_SECRET_BYTES` bytes, not all zero."""
    if isinstance(value, str):
        secret = value.encode()
    elif isinstance(value, bytes):
        secret = value
    else:
        raise TypeError(f"{name} must be str or bytes, got {type(value).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{name} is too short ({len(secret)} bytes): a shared secret needs at least "
            f"{MIN_SECRET_BYTES} bytes (e.g. python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    if not secret.strip(b"\x00"):
        raise ValueError(f"{name} is all zero bytes: it signs like the empty secret")
    return secret


def check_url(value: Any, name: str = "remote_cache") -> str:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL without query parameters that
    would override the timeouts (see :data:`_TIMING_PARAMS`)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a redis:// URL string, got {type(value).__name__}")
    if not value.startswith(URL_SCHEMES):
        raise ValueError(f"{name} must be a redis:// URL, got {redacted(value)!r}")
    query = urlsplit(value).query
    timing = sorted({k for k, _ in parse_qsl(query, keep_blank_values=True)} & _TIMING_PARAMS)
    if timing:
        raise ValueError(
            f"{name} sets {', '.join(timing)} in its query: the timeouts are "
            f"remote_timeout's (at most {MAX_TIMEOUT_S:g} s), not the URL's"
        )
    return value


def redacted(url: str) -> str:
    """The URL without its password, whether in ``user:password@`` or in the query
    (``?password=``): logs and ``repr`` must not carry it."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}" if user else f"***@{hostport}"
    query = "&".join(
        f"{quote(k)}=***"
        if any(s in unquote(k).lower() for s in _SECRET_PARAMS)
        else f"{quote(k)}={quote(v)}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
