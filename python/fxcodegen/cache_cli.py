"""``python -m fxcodegen cache ls|show|verify|clear [DIR]``: inspect the artifact cache;
``ls|verify|clear --remote URL``: the remote store (Redis) instead.

Nothing here unpickles or unmarshals: listing, showing and verifying read only the
checksummed JSON metadata (and check signatures), so they are safe on a cache of unknown
origin. File names are printed escaped (:func:`shown`): a name cannot forge a line or move
the terminal's cursor. Exit status: 0 fine, 1 problems found, 2 the command could not run
(no such cache, no secret, an unreachable or misbehaving server).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from typing import Any

from fxcodegen.cache import Cache, CacheError, resolve_cache_dir
from fxcodegen.cache.format import read_meta
from fxcodegen.cache.remote import SECRET_ENV, RemoteError, RemoteStore, resolve_secret, unsign

_FACTORS_SHOWN = ("compiler", "compile_ranges", "compile_sizes", "splitting_ops", "torch", "graph")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _factor_text(name: str, value: object) -> str:
    if name == "graph" and isinstance(value, str):
        return value[: len("sha256:") + 12]
    if isinstance(value, list):
        if value and all(isinstance(v, list) and len(v) == 2 for v in value):
            return ",".join(f"({a}, {b})" for a, b in value)
        return ",".join(map(str, value)) or "-"
    return str(value)


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` for a terminal: control characters, backslashes and bytes that are not
    UTF-8 escaped (``\\n``, ``\\x1b``, ``\\xff``), so every name prints as one line."""
    out = []
    for ch in os.fsdecode(path):
        if "\udc80" <= ch <= "\udcff":  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch == "\\" or not ch.isprintable():
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def _cache(args: argparse.Namespace) -> Cache:
    root = resolve_cache_dir(args.dir)
    assert root is not None
    return Cache(root)


def _remote(args: argparse.Namespace, *, need_secret: bool) -> RemoteStore | None:
    secret = resolve_secret(None)
    if need_secret and not secret:
        print(f"{SECRET_ENV} is not set: signatures cannot be checked", file=sys.stderr)
        return None
    return RemoteStore(args.remote, secret, timeout=args.timeout)


def _remote_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.RedisError, OSError, RemoteError, ValueError)


def remote_ls(args: argparse.Namespace) -> int:
    store = _remote(args, need_secret=False)
    assert store is not None
    names = sorted(store.scan("art"))
    print(f"{store!r}: {len(names)} artifact(s)")
    for name in names:
        value = store.run("get", name) or b""
        key = name.rpartition(":")[2]
        payload = unsign(store.secret, name, value) if store.secret else value[40:]
        if payload is None:
            print(f"{shown(key[:16])}  {_human(len(value)):>10}  BAD SIGNATURE")
            continue
        try:
            _, _, meta = read_meta(name, payload)  # type: ignore[arg-type]
        except CacheError as e:
            print(f"{shown(key[:16])}  {_human(len(value)):>10}  DAMAGED: {e.reason}")
            continue
        entries = sum(len(p.get("entries") or {}) for p in meta["pieces"])
        factors = meta.get("factors") or {}
        shown_factors = "  ".join(
            f"{n}={_factor_text(n, factors[n])}" for n in _FACTORS_SHOWN if n in factors
        )
        print(
            f"{shown(key[:16])}  {_human(len(value)):>10}  pieces={len(meta['pieces'])} "
            f"entries={entries}  {shown_factors}"
            + ("" if store.secret else "  (signature not checked)")
        )
    return 0


def remote_verify(args: argparse.Namespace) -> int:
    store = _remote(args, need_secret=True)
    if store is None:
        return 2
    names = sorted(store.scan())
    foreign = sum(1 for n in store.scan(every_namespace=True) if not n.startswith(store.namespace))
    problems = [(n, why) for n in names if (why := store.verify_name(n))]
    for name, why in problems:
        print(f"{shown(name)}: {why}")
    print(f"{store!r}: {len(names)} object(s), {len(problems)} object(s) with problems")
    if foreign:
        print(f"{foreign} object(s) signed with other secrets (not checked)")
    return 1 if problems else 0


def remote_clear(args: argparse.Namespace) -> int:
    store = _remote(args, need_secret=False)
    assert store is not None
    print(f"{store!r}: removed {store.clear()} object(s)")
    return 0


def _with_remote(local: Any, remote: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        if args.remote is None:
            return int(local(args))
        try:
            return int(remote(args))
        except _remote_errors() as e:
            print(f"cache {args.command} --remote: {type(e).__name__}: {e}", file=sys.stderr)
            return 2

    return run


def cmd_ls(args: argparse.Namespace) -> int:
    cache = _cache(args)
    if not cache.root.is_dir():
        print(f"{shown(cache.root)}: no cache directory")
        return 0
    keys = cache.keys()
    print(f"{shown(cache.root)}: {len(keys)} artifact(s)")
    total = 0
    for key in keys:
        info = cache.info(key)
        total += info.size
        if info.error:
            print(f"{key[:16]}  {_human(info.size):>10}  DAMAGED: {info.error}")
            continue
        factors = "  ".join(
            f"{name}={_factor_text(name, info.factors[name])}"
            for name in _FACTORS_SHOWN
            if name in info.factors
        )
        print(
            f"{key[:16]}  {_human(info.size):>10}  pieces={info.pieces} "
            f"entries={info.entries}  {factors}"
        )
    if keys:
        sizes = (p.lstat() for p in cache.root.rglob("*"))
        on_disk = sum(st.st_size for st in sizes if stat.S_ISREG(st.st_mode))
        print(f"{_human(on_disk)} on disk ({_human(total)} if blobs were not shared)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    cache = _cache(args)
    try:
        key = cache.find(args.key)
    except KeyError as e:
        print(f"{shown(cache.root)}: {e.args[0]}", file=sys.stderr)
        return 1
    try:
        meta = cache.read_meta(key)
    except CacheError as e:
        print(f"{shown(e.path)}: {shown(e.reason)}", file=sys.stderr)
        return 1
    if args.factors:
        print(json.dumps(meta.get("factors"), indent=2, sort_keys=True))
    else:
        sys.stdout.write(meta["code"])
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    cache = _cache(args)
    if not cache.root.is_dir():
        print(f"{shown(cache.root)}: no cache directory")
        return 0
    problems = cache.verify()
    keys = cache.keys()
    for path, reason in problems:
        print(f"{shown(path)}: {shown(reason)}")
    bad = len({p for p, _ in problems})
    print(f"{shown(cache.root)}: {len(keys)} artifact(s), {bad} file(s) with problems")
    return 1 if problems else 0


def cmd_clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    if not cache.root.is_dir():
        print(f"{shown(cache.root)}: no cache directory")
        return 0
    try:
        removed = cache.clear()
    except CacheError as e:
        print(f"not clearing {shown(e.path)}: {shown(e.reason)}", file=sys.stderr)
        return 2
    print(f"{shown(cache.root)}: removed {removed} file(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fxcodegen cache",
        description="Inspect, verify or clear the artifact cache. DIR defaults to "
        "$FXCODEGEN_CACHE_DIR, else ~/.cache/fxcodegen.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    remote_help = "the remote store (redis://host:port/db) instead of a directory"

    def remote_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--remote", metavar="URL", help=remote_help)
        p.add_argument(
            "--timeout",
            type=float,
            default=5.0,
            metavar="S",
            help="deadline of each Redis call, seconds (default 5)",
        )

    p = sub.add_parser("ls", help="list artifacts with key factors, sizes, entries and pieces")
    p.add_argument("dir", nargs="?", metavar="DIR")
    remote_args(p)
    p.set_defaults(fn=_with_remote(cmd_ls, remote_ls))
    p = sub.add_parser("show", help="print one artifact's stitching code")
    p.add_argument("key", metavar="KEY", help="the key or a unique prefix of it")
    p.add_argument("dir", nargs="?", metavar="DIR")
    p.add_argument("--factors", action="store_true", help="print the key's factors instead")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser(
        "verify",
        help="check checksums and permissions (remote: signatures, under "
        f"${SECRET_ENV}); exit 1 on any problem",
    )
    p.add_argument("dir", nargs="?", metavar="DIR")
    remote_args(p)
    p.set_defaults(fn=_with_remote(cmd_verify, remote_verify))
    p = sub.add_parser("clear", help="remove all artifacts, blobs and locks")
    p.add_argument("dir", nargs="?", metavar="DIR")
    remote_args(p)
    p.set_defaults(fn=_with_remote(cmd_clear, remote_clear))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        # Whatever the locale's encoding, a name it cannot encode prints escaped.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    try:
        return int(args.fn(args))
    except ValueError as e:  # a bad DIR or secret: the check names it
        print(f"cache {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
