"""The artifact cache: one integrity-checked file per compiled graph, piece blobs stored once.

Layout of a cache directory (owner-only, see ``docs/cache.md``)::

    DIR/                      0700
      <key>.fxc               0600  the artifact: header + sections (meta, code, consts)
      <key>.factors.json      0600  the key's factors, human-readable
      blobs/<sha256>          0600  one compiled piece-entry, named by the hash of its bytes
      locks/<key>.lock        0600  the per-key lock (``filelock``)

Nothing in this module needs the compiled core at import time: the only function that
runs generated code (:meth:`Artifact.execution_fn`) imports :mod:`fxcodegen.codegen` when
called. The backend-facing methods of :class:`Cache` (``load``, ``store``,
``get_or_create``) never raise on a damaged or untrusted cache: they log a warning on the
``fxcodegen`` logger and treat it as a miss. Only the explicit :func:`load_artifact` raises
:class:`CacheError`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import linecache
import logging
import marshal
import math
import os
import pickle
import platform
import re
import stat
import struct
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ARTIFACT_SUFFIX",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "Artifact",
    "Cache",
    "CacheError",
    "PieceRecord",
    "compute_key",
    "explain_difference",
    "load_artifact",
    "make_factors",
    "open_cache",
    "resolve_cache_dir",
]

log = logging.getLogger("fxcodegen")

FORMAT_VERSION = 2
"""Version written by this fxcodegen. 1: no constant pool (``consts`` absent); 2: adds it."""
READABLE_VERSIONS = (1, 2)
"""Versions this fxcodegen reads; any other is a clean miss."""

MAGIC = b"FXCGART\x00"
BLOB_MAGIC = b"FXCGBLB\x00"
# magic, format version, payload length, sha256(payload)
_HEADER = struct.Struct("<8sIQ32s")
# magic, content length; the content's sha256 is the blob's file name
_BLOB_HEADER = struct.Struct("<8sQ")
_SECTION_NAME = struct.Struct("<H")
_SECTION_LEN = struct.Struct("<Q")

ARTIFACT_SUFFIX = ".fxc"
FACTORS_SUFFIX = ".factors.json"
BLOBS_DIR = "blobs"
LOCKS_DIR = "locks"
TMP_PREFIX = ".tmp-"
ENV_VAR = "FXCODEGEN_CACHE_DIR"
DEFAULT_FN_NAME = "execution_fn"

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


class CacheError(Exception):
    """An artifact that cannot be used: damaged, of an unknown format, unreadable or untrusted.

    Raised only by explicit load APIs (:func:`load_artifact`); the backend-facing
    :class:`Cache` methods log it as a warning and treat it as a miss.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path = Path(path)
        self.reason = reason


# --------------------------------------------------------------------------------------
# What is stored


@dataclass(frozen=True)
class PieceRecord:
    """One compiled piece (a non-splitting submodule) and its dispatch data."""

    name: str
    """The submodule's name in the split graph (one of ``Artifact.submod_names``)."""
    entries: Mapping[str, bytes]
    """Entry label -> the compiled result's bytes (opaque; e.g. Inductor's serialized
    artifact). Labels are free-form strings chosen by the backend, e.g. ``"range:1-8"``."""
    sym_shape_indices: tuple[int, ...] = ()
    """Indices of the piece's inputs that carry the symbolic size used for dispatch."""
    returns_tuple: bool = True
    """Whether the piece's graph returns a tuple (else the compiled result is unwrapped)."""
    compile_ranges: tuple[tuple[int, int], ...] = ()
    """Inclusive ``(start, end)`` size ranges compiled for this piece."""
    compile_sizes: tuple[int, ...] = ()
    """Single sizes compiled for this piece."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Anything else the backend wants back, JSON-serializable."""


@dataclass
class Artifact:
    """A compiled graph: its stitching code, pool, code object and compiled pieces."""

    code: str
    """Python source defining the stitching function ``fn_name``."""
    submod_names: list[str]
    """``submod_names[i]`` is the child called as submodule ``i``."""
    consts: list[Any] | None
    """The constant pool; ``None`` for code generated without one (format 1)."""
    pieces: list[PieceRecord] = field(default_factory=list)
    fn_name: str = DEFAULT_FN_NAME
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the backend wants back, JSON-serializable."""
    storable: bool = True
    """Set False (e.g. when a piece's compiled result could not be exported) to have
    :meth:`Cache.get_or_create` use it without storing it. Not stored."""
    code_object: types.CodeType | None = None
    """The module code object of ``code``; on load, unmarshaled or compiled from source."""
    code_origin: str = "none"
    """How ``code_object`` was obtained: ``"marshal"``, ``"source"`` or ``"none"``."""
    filename: str = ""
    """The synthetic file name the code object was compiled under (registered in linecache)."""
    key: str = ""
    factors: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    path: Path | None = None

    def prepare(self, key: str, factors: Mapping[str, Any]) -> Artifact:
        """Fill in ``key``, ``factors``, ``filename`` and (compiling the source once) the
        code object of a freshly made artifact, as a load would; returns ``self``."""
        self.key = key
        self.factors = _canonical(dict(factors))
        self.filename = _synthetic_filename(key)
        if self.code_object is None or self.code_object.co_filename != self.filename:
            self.code_object = compile(self.code, self.filename, "exec")
            self.code_origin = "source"
        return self

    def piece(self, name: str) -> PieceRecord:
        for p in self.pieces:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def num_entries(self) -> int:
        return sum(len(p.entries) for p in self.pieces)

    def execution_fn(
        self, submod_callables: Mapping[str, Callable[..., Any]] | None
    ) -> Callable[..., Any]:
        """Bind the stored code object to ``submod_callables`` and the pool; no ``compile()``
        of source when the code object was unmarshaled."""
        from fxcodegen import codegen  # needs the compiled core

        code_obj = self.code_object
        filename = self.filename or _synthetic_filename(self.key or _sha256(self.code.encode()))
        if code_obj is None:
            code_obj = compile(self.code, filename, "exec")
        ns = codegen.bind_namespace(dict(submod_callables or {}), self.submod_names, self.consts)
        lines = self.code.splitlines(keepends=True)
        linecache.cache[filename] = (len(self.code), None, lines, filename)
        exec(code_obj, ns)  # noqa: S102
        codegen.check_bindings(code_obj, self.submod_names, ns)
        return ns[self.fn_name]


# --------------------------------------------------------------------------------------
# The key


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> Any:
    """A JSON value that is equal across processes for equal inputs (no addresses)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if hasattr(value, "start") and hasattr(value, "end"):  # a Range
        return [_canonical(value.start), _canonical(value.end)]
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{value.__module__}.{value.__qualname__}"
    return _ADDRESS_RE.sub("", repr(value))


@functools.lru_cache(maxsize=1)
def _fxcodegen_build() -> tuple[str, str]:
    """(version, hash of the package's modules and compiled core): a development build
    that changes what is generated changes the key even when the version does not."""
    version = "unknown"
    try:
        from fxcodegen._core import __version__ as version
    except ImportError:
        try:
            from importlib.metadata import version as _dist_version

            version = _dist_version("fxcodegen")
        except Exception:  # noqa: BLE001 - not installed: the hash below still identifies it
            pass
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parent
    for p in sorted([*pkg.glob("*.py"), *pkg.glob("_core*")]):
        if p.is_file():
            h.update(p.name.encode() + b"\0")
            h.update(p.read_bytes())
    return version, h.hexdigest()


def _torch_versions() -> dict[str, str]:
    import torch

    return {"torch": torch.__version__, "torch_git": str(torch.version.git_version)}


def make_factors(
    *,
    graph: bytes,
    splitting_ops: Sequence[Any] | None,
    compile_ranges: Sequence[Any] | None,
    compile_sizes: Sequence[int] = (),
    compiler: str,
    compiler_options: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The factors that determine a compiled graph, as a JSON-able dict.

    ``graph`` is the serialized node list (:func:`fxcodegen.serialize` of the split graph);
    only its hash and length enter. ``extra`` is for anything else that changes the result
    (e.g. a hash of the global Inductor config, a GPU's compute capability). Nothing here
    depends on paths, host names, process ids, ranks or time.
    """
    version, build = _fxcodegen_build()
    factors: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "graph": f"sha256:{_sha256(graph)}",
        "graph_bytes": len(graph),
        "splitting_ops": sorted(str(op) for op in (splitting_ops or ())),
        "compile_ranges": None
        if compile_ranges is None
        else sorted(_canonical(list(compile_ranges))),
        "compile_sizes": sorted({int(s) for s in compile_sizes}),
        "compiler": str(compiler),
        "compiler_options": _canonical(compiler_options or {}),
        "fxcodegen": version,
        "fxcodegen_build": build,
        **_torch_versions(),
        "python": f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}",
        "platform": f"{platform.system()}-{platform.machine()}",
    }
    if extra:
        factors["extra"] = _canonical(extra)
    return factors


def compute_key(factors: Mapping[str, Any]) -> str:
    """The cache key of ``factors``: sha256 of their canonical JSON (64 hex digits)."""
    text = json.dumps(_canonical(factors), sort_keys=True, separators=(",", ":"))
    return _sha256(text.encode())


def _short(value: Any, limit: int = 48) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


def explain_difference(
    mine: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = ""
) -> list[str]:
    """The factors that differ, each as ``"name: THEIRS -> MINE"``; factors that are
    mappings on both sides are compared member by member (``"extra.pieces.submod_2: ..."``),
    so a miss names the piece or the value that changed."""
    out = []
    for name in sorted(set(mine) | set(theirs)):
        a, b = theirs.get(name, "<absent>"), mine.get(name, "<absent>")
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += explain_difference(b, a, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}: {_short(a)} -> {_short(b)}")
    return out


# --------------------------------------------------------------------------------------
# The file format


def _code_tag() -> str | None:
    """Tags marshaled code: it loads only under the very same bytecode format."""
    cache_tag = sys.implementation.cache_tag
    if cache_tag is None:
        return None
    return f"{cache_tag}:{importlib.util.MAGIC_NUMBER.hex()}"


def _synthetic_filename(key: str) -> str:
    return f"<fxcodegen-cache-{key[:16]}>"


def _encode_sections(sections: Sequence[tuple[str, bytes]]) -> bytes:
    parts = []
    for name, data in sections:
        raw = name.encode()
        parts += [_SECTION_NAME.pack(len(raw)), raw, _SECTION_LEN.pack(len(data)), data]
    return b"".join(parts)


def _decode_sections(path: Path, payload: bytes) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    pos, n = 0, len(payload)
    while pos < n:
        if pos + _SECTION_NAME.size > n:
            raise CacheError(path, "malformed section table")
        (name_len,) = _SECTION_NAME.unpack_from(payload, pos)
        pos += _SECTION_NAME.size
        end = pos + name_len + _SECTION_LEN.size
        if end > n:
            raise CacheError(path, "malformed section table")
        name = payload[pos : pos + name_len].decode("utf-8", "replace")
        (length,) = _SECTION_LEN.unpack_from(payload, pos + name_len)
        pos = end
        if pos + length > n:
            raise CacheError(path, f"section {name!r} runs past the end")
        out[name] = payload[pos : pos + length]
        pos += length
    return out


def _load_torch_op(namespace: str, name: str, overload: str | None) -> Any:
    """Unpickles an operator of the pool by name (see :class:`_PoolPickler`)."""
    import torch

    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


class _PoolPickler(pickle.Pickler):
    """Pickles torch operators (which do not pickle) as their ``torch.ops`` names."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None:  # no torch object can exist
            return NotImplemented
        ops = torch._ops
        if isinstance(obj, ops.OpOverload):
            return _load_torch_op, (obj.namespace, obj._opname, obj._overloadname)
        if isinstance(obj, ops.OpOverloadPacket):
            namespace, name = obj._qualified_op_name.split("::", 1)
            return _load_torch_op, (namespace, name, None)
        if isinstance(obj, ops.HigherOrderOperator):
            return _load_torch_op, ("higher_order", obj.name(), None)
        return NotImplemented


def _dumps_pool(consts: Sequence[Any]) -> bytes:
    buf = io.BytesIO()
    _PoolPickler(buf, protocol=4).dump(list(consts))
    return buf.getvalue()


def _encode_blob(data: bytes) -> bytes:
    return _BLOB_HEADER.pack(BLOB_MAGIC, len(data)) + data


def _decode_blob(path: Path, raw: bytes, digest: str) -> bytes:
    if not raw:
        raise CacheError(path, "empty blob")
    if len(raw) < _BLOB_HEADER.size:
        raise CacheError(path, "truncated blob header")
    magic, length = _BLOB_HEADER.unpack_from(raw)
    if magic != BLOB_MAGIC:
        raise CacheError(path, "not an fxcodegen blob (bad magic)")
    data = raw[_BLOB_HEADER.size :]
    if len(data) != length:
        raise CacheError(path, f"blob truncated or padded ({len(data)} of {length} bytes)")
    if _sha256(data) != digest:
        raise CacheError(path, "blob checksum mismatch")
    return data


def encode_artifact(
    artifact: Artifact, key: str, factors: Mapping[str, Any], *, version: int = FORMAT_VERSION
) -> tuple[bytes, dict[str, bytes]]:
    """The artifact file's bytes and the blobs it references (sha256 -> bytes).

    ``version=1`` writes the pool-less older format (tests of backward compatibility).
    Raises whatever pickling the pool raises.
    """
    blobs: dict[str, bytes] = {}
    pieces_meta = []
    for p in artifact.pieces:
        entries = {}
        for label, data in p.entries.items():
            digest = _sha256(data)
            blobs[digest] = bytes(data)
            entries[str(label)] = {"blob": digest, "bytes": len(data)}
        pieces_meta.append(
            {
                "name": p.name,
                "sym_shape_indices": [int(i) for i in p.sym_shape_indices],
                "returns_tuple": bool(p.returns_tuple),
                "compile_ranges": [[int(a), int(b)] for a, b in p.compile_ranges],
                "compile_sizes": [int(s) for s in p.compile_sizes],
                "entries": entries,
                "extra": _canonical(dict(p.extra)),
            }
        )
    filename = _synthetic_filename(key)
    tag = _code_tag()
    meta = {
        "key": key,
        "factors": _canonical(dict(factors)),
        "fn_name": artifact.fn_name,
        "code": artifact.code,
        "filename": filename,
        "submod_names": list(artifact.submod_names),
        "pieces": pieces_meta,
        "extra": _canonical(artifact.extra),
        "code_tag": tag,
        "has_consts": version >= 2 and artifact.consts is not None,
    }
    sections = [("meta", json.dumps(meta, sort_keys=True).encode())]
    if tag is not None:
        code_obj = artifact.code_object
        if code_obj is None or code_obj.co_filename != filename:
            code_obj = compile(artifact.code, filename, "exec")
        sections.append(("code", marshal.dumps(code_obj)))
    if meta["has_consts"]:
        sections.append(("consts", _dumps_pool(artifact.consts)))
    payload = _encode_sections(sections)
    header = _HEADER.pack(MAGIC, version, len(payload), hashlib.sha256(payload).digest())
    return header + payload, blobs


def _verified_sections(path: Path, raw: bytes) -> tuple[int, dict[str, bytes]]:
    """Check header and checksum; nothing is unpickled or unmarshaled before this passes."""
    if not raw:
        raise CacheError(path, "empty file")
    if len(raw) < _HEADER.size:
        raise CacheError(path, f"truncated header ({len(raw)} of {_HEADER.size} bytes)")
    magic, version, length, digest = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise CacheError(path, "not an fxcodegen artifact (bad magic)")
    if version not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS))
        raise CacheError(
            path, f"unknown format version {version} (this fxcodegen reads {readable})"
        )
    payload = raw[_HEADER.size :]
    if len(payload) < length:
        raise CacheError(path, f"truncated ({len(payload)} of {length} payload bytes)")
    if len(payload) > length:
        raise CacheError(path, f"{len(payload) - length} trailing bytes after the payload")
    if hashlib.sha256(payload).digest() != digest:
        raise CacheError(path, "checksum mismatch")
    return version, _decode_sections(path, payload)


def _read_meta(path: Path, raw: bytes) -> tuple[int, dict[str, bytes], dict[str, Any]]:
    version, sections = _verified_sections(path, raw)
    if "meta" not in sections:
        raise CacheError(path, "no meta section")
    try:
        meta = json.loads(sections["meta"])
        if not isinstance(meta, dict):
            raise ValueError("meta is not an object")
        for name, typ in (("key", str), ("code", str), ("submod_names", list), ("pieces", list)):
            if not isinstance(meta.get(name), typ):
                raise ValueError(f"meta field {name!r} missing or of the wrong type")
    except ValueError as e:
        raise CacheError(path, f"malformed metadata: {e}") from None
    return version, sections, meta


def _check_owner_only(path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` is not trusted, or None."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _read_file(path: Path) -> tuple[bytes, os.stat_result]:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        return f.read(), st


def _read_trusted(path: Path, kind: str | None = None) -> bytes:
    """The bytes of ``path``; :class:`CacheError` if it cannot be read or is not owner-only.
    ``kind`` names the kind of file in the reason (``"unreadable blob (...)"``)."""
    try:
        raw, st = _read_file(path)
    except OSError as e:
        what = f"unreadable {kind}" if kind else "unreadable"
        raise CacheError(path, f"{what} ({e.strerror or e})") from None
    why = _check_owner_only(path, st)
    if why:
        raise CacheError(path, f"not trusted: {why}")
    return raw


def _decode_artifact(
    path: Path, raw: bytes, blob_dir: Path, *, expected_key: str | None = None
) -> Artifact:
    version, sections, meta = _read_meta(path, raw)
    if expected_key is not None and meta["key"] != expected_key:
        raise CacheError(path, f"holds key {meta['key'][:16]}…, not {expected_key[:16]}…")
    try:
        pieces = []
        for pm in meta["pieces"]:
            entries = {}
            for label, ref in pm["entries"].items():
                digest = ref["blob"]
                if not isinstance(digest, str) or not _KEY_RE.match(digest):
                    raise ValueError(f"bad blob reference {digest!r}")
                bpath = blob_dir / digest
                entries[label] = _decode_blob(bpath, _read_trusted(bpath, "blob"), digest)
            pieces.append(
                PieceRecord(
                    name=pm["name"],
                    entries=entries,
                    sym_shape_indices=tuple(int(i) for i in pm["sym_shape_indices"]),
                    returns_tuple=bool(pm["returns_tuple"]),
                    compile_ranges=tuple((int(a), int(b)) for a, b in pm["compile_ranges"]),
                    compile_sizes=tuple(int(s) for s in pm["compile_sizes"]),
                    extra=dict(pm.get("extra") or {}),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CacheError(path, f"malformed piece metadata: {e!r}") from None

    filename = meta.get("filename") or _synthetic_filename(meta["key"])
    code_obj, origin = None, "source"
    if "code" in sections and meta.get("code_tag") is not None and meta["code_tag"] == _code_tag():
        try:
            code_obj = marshal.loads(sections["code"])
        except (ValueError, EOFError, TypeError) as e:
            raise CacheError(path, f"cannot unmarshal the code object: {e}") from None
        if not isinstance(code_obj, types.CodeType):
            raise CacheError(path, "the code section is not a code object")
        origin = "marshal"
    else:
        if "code" in sections:
            log.info(
                "fxcodegen cache: %s was written by another Python (%s, this is %s); "
                "compiling its source",
                path,
                meta.get("code_tag"),
                _code_tag(),
            )
        try:
            code_obj = compile(meta["code"], filename, "exec")
        except SyntaxError as e:
            raise CacheError(path, f"stored source does not compile: {e}") from None

    consts = None
    if version >= 2 and meta.get("has_consts"):
        if "consts" not in sections:
            raise CacheError(path, "the pool section is missing")
        try:
            consts = pickle.loads(sections["consts"])  # noqa: S301 - checksummed, owner-only
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a damaged artifact
            raise CacheError(path, f"cannot unpickle the pool: {type(e).__name__}: {e}") from None
        if not isinstance(consts, list):
            raise CacheError(path, "the pool is not a list")

    return Artifact(
        code=meta["code"],
        submod_names=[str(n) for n in meta["submod_names"]],
        consts=consts,
        pieces=pieces,
        fn_name=str(meta.get("fn_name") or DEFAULT_FN_NAME),
        extra=dict(meta.get("extra") or {}),
        code_object=code_obj,
        code_origin=origin,
        filename=filename,
        key=meta["key"],
        factors=dict(meta.get("factors") or {}),
        format_version=version,
        path=path,
    )


def load_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Load one artifact file (its blobs from ``blobs/`` next to it).

    Raises :class:`CacheError` naming the file and the reason when it is missing,
    unreadable, empty, truncated, corrupted, of an unknown format version, or not
    owner-only. Nothing is unpickled or unmarshaled before its checksum is verified.
    """
    path = Path(path)
    return _decode_artifact(path, _read_trusted(path), path.parent / BLOBS_DIR)


# --------------------------------------------------------------------------------------
# Writing


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a 0600 temporary file next to ``path``, fsync it, rename it over
    ``path``: readers see the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


# --------------------------------------------------------------------------------------
# The cache directory


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | bool | None) -> Path | None:
    """``None`` -> ``$FXCODEGEN_CACHE_DIR``, else ``~/.cache/fxcodegen``; ``False`` -> disabled
    (``None``); a path -> that path."""
    if cache_dir is False:
        return None
    if cache_dir is None or cache_dir is True:
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
    """What ``Cache.list`` reports for one artifact file (read without unpickling)."""

    key: str
    path: Path
    size: int
    """Bytes of the artifact file plus the blobs it references."""
    pieces: int = 0
    entries: int = 0
    factors: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class Cache:
    """A cache directory. Thread- and process-safe; the backend-facing methods never raise."""

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 3600.0) -> None:
        self.root = Path(root).expanduser()
        self.lock_timeout = lock_timeout
        self._trust: str | None | bool = False  # False: not checked yet; None: trusted
        self._warned: set[str] = set()

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
    def _warn_once(self, message: str, *args: Any) -> None:
        text = message % args
        if text not in self._warned:
            self._warned.add(text)
            log.warning(text)

    def untrusted_reason(self, *, create: bool = True) -> str | None:
        """Why this directory must not be used (None when it may), creating it owner-only."""
        if self._trust is not False:
            return self._trust  # type: ignore[return-value]
        reason = None
        try:
            for d in (self.root, self.root / BLOBS_DIR, self.root / LOCKS_DIR):
                if create and not d.exists():
                    d.mkdir(mode=0o700, parents=True, exist_ok=True)
                    os.chmod(d, 0o700)
                st = os.stat(d)
                if not stat.S_ISDIR(st.st_mode):
                    reason = f"{d} is not a directory"
                    break
                why = _check_owner_only(d, st)
                if why:
                    reason = f"{d} is {why}"
                    break
        except OSError as e:
            reason = f"{self.root} cannot be used ({e.strerror or e})"
        self._trust = reason
        return reason

    def usable(self) -> bool:
        """Whether the directory is trusted; warns (once) and returns False when not."""
        reason = self.untrusted_reason()
        if reason is not None:
            self._warn_once(
                "fxcodegen cache: not using %s: %s; compiling without it", self.root, reason
            )
        return reason is None

    # locking
    @contextlib.contextmanager
    def locked(self, key: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the per-key lock (an exclusive ``filelock.FileLock`` on ``locks/<key>.lock``).

        Raises ``filelock.Timeout`` after ``timeout`` seconds (default ``lock_timeout``).
        """
        import filelock

        _check_key(key)
        lock = filelock.FileLock(
            self.lock_path(key),
            timeout=self.lock_timeout if timeout is None else timeout,
            mode=0o600,
        )
        with lock:
            yield

    # reading
    def _load(self, key: str) -> tuple[Artifact | None, Any]:
        """(artifact or None, a signature of the file read: stat identity or None)."""
        path = self.artifact_path(key)
        try:
            raw, st = _read_file(path)
        except FileNotFoundError:
            return None, None
        except OSError as e:
            log.warning(
                "fxcodegen cache: ignoring %s: unreadable (%s); compiling afresh",
                path,
                e.strerror or e,
            )
            return None, self._stat_sig(key)[1] or ("unreadable", str(e))
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        why = _check_owner_only(path, st)
        if why:
            log.warning(
                "fxcodegen cache: not reading %s: it is %s; compiling without it", path, why
            )
            return None, sig
        try:
            art = _decode_artifact(path, raw, self.root / BLOBS_DIR, expected_key=key)
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
        return its path; on any failure log a warning and return None."""
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
        try:
            for digest, blob in blobs.items():
                self._store_blob(digest, blob)
            doc = {"key": key, "format": FORMAT_VERSION, "factors": _canonical(dict(factors))}
            text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
            _atomic_write(self.factors_path(key), text.encode())
            path = self.artifact_path(key)
            _atomic_write(path, data)
        except OSError as e:
            log.warning("fxcodegen cache: could not write %s: %s", key[:16], e)
            return None
        log.info("fxcodegen cache: stored %s (%d bytes, %d blobs)", key[:16], len(data), len(blobs))
        return path

    def _store_blob(self, digest: str, data: bytes) -> None:
        path = self.blob_path(digest)
        try:
            _decode_blob(path, _read_trusted(path, "blob"), digest)
            return  # already stored, intact and owner-only
        except CacheError:
            pass  # absent, damaged or untrusted: (re)write it
        _atomic_write(path, _encode_blob(data))

    def get_or_create(
        self, key: str, factors: Mapping[str, Any], create_fn: Callable[[], Artifact]
    ) -> tuple[Artifact, bool]:
        r"""The artifact for ``key``, loaded or made by ``create_fn()`` and stored.

        Returns ``(artifact, loaded)``. Of many processes asking for the same key at once,
        one calls ``create_fn`` (under the key's lock) while the others wait and then load.
        Errors from ``create_fn`` propagate; cache problems never do. A created artifact
        is prepared (:meth:`Artifact.prepare`), so both paths bind it with ``execution_fn``.
        """
        if not self.usable():
            return create_fn().prepare(key, factors), False
        art, sig = self._load(key)
        if art is not None:
            return art, True
        import filelock

        try:
            with self.locked(key):
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
        except filelock.Timeout:
            log.warning(
                "fxcodegen cache: lock for %s not acquired in %.0fs; compiling without the cache",
                key[:16],
                self.lock_timeout,
            )
            return create_fn().prepare(key, factors), False

    def _stat_sig(self, key: str) -> tuple[Path, Any]:
        path = self.artifact_path(key)
        try:
            st = os.stat(path)
        except OSError:
            return path, None
        return path, (st.st_ino, st.st_size, st.st_mtime_ns)

    # explaining
    def _all_factors(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for p in sorted(self.root.glob(f"*{FACTORS_SUFFIX}")):
            try:
                doc = json.loads(p.read_text())
                yield str(doc["key"]), dict(doc["factors"])
            except (OSError, ValueError, KeyError, TypeError):
                continue

    def explain_miss(self, key: str, factors: Mapping[str, Any]) -> str:
        """A line saying why ``key`` missed: the factors that differ from the nearest
        stored artifact (the one with the fewest differing factors)."""
        mine = _canonical(dict(factors))
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
            if _KEY_RE.match(key):
                out.append(key)
        return out

    def read_meta(self, key: str) -> dict[str, Any]:
        """The artifact's checksum-verified metadata (``code``, ``factors``, ``pieces``,
        ...), read without unpickling or unmarshaling anything. Raises :class:`CacheError`."""
        path = self.artifact_path(key)
        try:
            raw, _ = _read_file(path)
        except OSError as e:
            raise CacheError(path, f"unreadable ({e.strerror or e})") from None
        return _read_meta(path, raw)[2]

    def info(self, key: str) -> StoredInfo:
        """Sizes, pieces, entries and factors of one artifact, read without unpickling."""
        path = self.artifact_path(key)
        info = StoredInfo(key=key, path=path, size=0)
        try:
            raw, _ = _read_file(path)
            info.size = len(raw)
            _, _, meta = _read_meta(path, raw)
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
                info.size += os.stat(self.blob_path(d)).st_size
        return info

    def find(self, prefix: str) -> str:
        """The one stored key starting with ``prefix`` (KeyError if none or several)."""
        matches = [k for k in self.keys() if k.startswith(prefix)]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} artifacts match {prefix!r}")
        return matches[0]

    def verify(self) -> list[tuple[Path, str]]:
        """Every problem found, as ``(path, reason)``: checksums of artifacts and blobs,
        permissions, unreferenced blobs and stale temporary files. Unpickles nothing."""
        problems: list[tuple[Path, str]] = []
        reason = self.untrusted_reason(create=False)
        if reason is not None:
            problems.append((self.root, reason))
        referenced: set[str] = set()
        for key in self.keys():
            path = self.artifact_path(key)
            try:
                raw, st = _read_file(path)
                why = _check_owner_only(path, st)
                if why:
                    problems.append((path, why))
                _, _, meta = _read_meta(path, raw)
                if meta["key"] != key:
                    problems.append((path, f"holds key {meta['key'][:16]}…"))
                for pm in meta["pieces"]:
                    for ref in pm["entries"].values():
                        referenced.add(ref["blob"])
            except OSError as e:
                problems.append((path, f"unreadable ({e.strerror or e})"))
            except CacheError as e:
                problems.append((e.path, e.reason))
            except (KeyError, TypeError, AttributeError) as e:
                problems.append((path, f"malformed piece metadata: {e!r}"))
        blob_dir = self.root / BLOBS_DIR
        present = {p.name for p in blob_dir.iterdir()} if blob_dir.is_dir() else set()
        for digest in sorted(referenced | present):
            bpath = blob_dir / digest
            if digest not in present:
                problems.append((bpath, "missing blob"))
                continue
            if digest.startswith(TMP_PREFIX):
                problems.append((bpath, "stale temporary file"))
                continue
            try:
                raw, st = _read_file(bpath)
                why = _check_owner_only(bpath, st)
                if why:
                    problems.append((bpath, why))
                _decode_blob(bpath, raw, digest)
            except OSError as e:
                problems.append((bpath, f"unreadable ({e.strerror or e})"))
            except CacheError as e:
                problems.append((bpath, e.reason))
            if digest not in referenced:
                problems.append((bpath, "unreferenced blob"))
        for p in sorted(self.root.glob(f"{TMP_PREFIX}*")):
            problems.append((p, "stale temporary file"))
        return problems

    def clear(self) -> int:
        """Remove every artifact, factors file, blob, lock and temporary file; return how
        many files were removed. The directory itself stays."""
        removed = 0
        patterns = [f"*{ARTIFACT_SUFFIX}", f"*{FACTORS_SUFFIX}", f"{TMP_PREFIX}*"]
        files = [p for pat in patterns for p in self.root.glob(pat)]
        for sub in (BLOBS_DIR, LOCKS_DIR):
            d = self.root / sub
            if d.is_dir():
                files += list(d.iterdir())
        for p in files:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed += 1
        return removed


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
