"""The artifact and blob files' bytes, and reading them back with every check done before
anything is unpickled or unmarshaled. ``docs/cache.md`` describes the format byte by byte.

Nothing here runs the stored code: binding it to the pieces
(:func:`fxcodegen.codegen.bind_stored`) is the compile layer's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import logging
import marshal
import os
import pickle
import struct
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fxcodegen.cache import trust
from fxcodegen.cache.artifact import (
    DEFAULT_FN_NAME,
    Artifact,
    PieceRecord,
    canonical,
    sha256,
    synthetic_filename,
)
from fxcodegen.cache.layout import BLOBS_DIR, FORMAT_VERSION, KEY_RE, READABLE_VERSIONS

__all__ = [
    "BLOB_MAGIC",
    "HEADER",
    "MAGIC",
    "CacheError",
    "code_tag",
    "decode_artifact",
    "decode_blob",
    "encode_artifact",
    "encode_blob",
    "load_artifact",
    "load_torch_op",
    "read_meta",
    "read_trusted",
]

log = logging.getLogger("fxcodegen")

MAGIC = b"FXCGART\x00"
BLOB_MAGIC = b"FXCGBLB\x00"
# magic, format version, payload length, sha256(payload)
HEADER = struct.Struct("<8sIQ32s")
# magic, content length; the content's sha256 is the blob's file name
_BLOB_HEADER = struct.Struct("<8sQ")
_SECTION_NAME = struct.Struct("<H")
_SECTION_LEN = struct.Struct("<Q")


class CacheError(Exception):
    """An artifact that cannot be used: damaged, of an unknown format, unreadable or untrusted.

    Raised only by explicit load APIs (:func:`load_artifact`); the backend-facing
    :class:`Cache` methods log it as a warning and treat it as a miss.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path = Path(path)
        self.reason = reason


def code_tag() -> str | None:
    """Tags marshaled code: it loads only under the very same bytecode format."""
    cache_tag = sys.implementation.cache_tag
    if cache_tag is None:
        return None
    return f"{cache_tag}:{importlib.util.MAGIC_NUMBER.hex()}"


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


def load_torch_op(namespace: str, name: str, overload: str | None) -> Any:
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
            return load_torch_op, (obj.namespace, obj._opname, obj._overloadname)
        if isinstance(obj, ops.OpOverloadPacket):
            namespace, name = obj._qualified_op_name.split("::", 1)
            return load_torch_op, (namespace, name, None)
        if isinstance(obj, ops.HigherOrderOperator):
            return load_torch_op, ("higher_order", obj.name(), None)
        return NotImplemented


def _dumps_pool(consts: Sequence[Any]) -> bytes:
    buf = io.BytesIO()
    _PoolPickler(buf, protocol=4).dump(list(consts))
    return buf.getvalue()


def encode_blob(data: bytes) -> bytes:
    return _BLOB_HEADER.pack(BLOB_MAGIC, len(data)) + data


def decode_blob(path: Path, raw: bytes, digest: str) -> bytes:
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
    if sha256(data) != digest:
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
            digest = sha256(data)
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
                "extra": canonical(dict(p.extra)),
            }
        )
    filename = synthetic_filename(key)
    tag = code_tag()
    meta = {
        "key": key,
        "factors": canonical(dict(factors)),
        "fn_name": artifact.fn_name,
        "code": artifact.code,
        "filename": filename,
        "submod_names": list(artifact.submod_names),
        "pieces": pieces_meta,
        "extra": canonical(artifact.extra),
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
    header = HEADER.pack(MAGIC, version, len(payload), hashlib.sha256(payload).digest())
    return header + payload, blobs


def _verified_sections(path: Path, raw: bytes) -> tuple[int, dict[str, bytes]]:
    """Check header and checksum; nothing is unpickled or unmarshaled before this passes."""
    if not raw:
        raise CacheError(path, "empty file")
    if len(raw) < HEADER.size:
        raise CacheError(path, f"truncated header ({len(raw)} of {HEADER.size} bytes)")
    magic, version, length, digest = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise CacheError(path, "not an fxcodegen artifact (bad magic)")
    if version not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS))
        raise CacheError(
            path, f"unknown format version {version} (this fxcodegen reads {readable})"
        )
    payload = raw[HEADER.size :]
    if len(payload) < length:
        raise CacheError(path, f"truncated ({len(payload)} of {length} payload bytes)")
    if len(payload) > length:
        raise CacheError(path, f"{len(payload) - length} trailing bytes after the payload")
    if hashlib.sha256(payload).digest() != digest:
        raise CacheError(path, "checksum mismatch")
    return version, _decode_sections(path, payload)


def read_meta(path: Path, raw: bytes) -> tuple[int, dict[str, bytes], dict[str, Any]]:
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


def read_trusted(path: Path, kind: str | None = None) -> bytes:
    """The bytes of ``path`` (read as :func:`trust.read_file` reads); :class:`CacheError`
    when it cannot be read or is not an owner-only regular file. ``kind`` names the kind
    of file in the reason (``"unreadable blob (...)"``)."""
    try:
        raw, _ = trust.read_file(path)
    except trust.UnsafeFileError as e:
        raise CacheError(path, f"not trusted: {e.strerror}") from None
    except OSError as e:
        what = f"unreadable {kind}" if kind else "unreadable"
        raise CacheError(path, f"{what} ({e.strerror or e})") from None
    return raw


def decode_artifact(
    path: Path, raw: bytes, blob_dir: Path, *, expected_key: str | None = None
) -> Artifact:
    version, sections, meta = read_meta(path, raw)
    if expected_key is not None and meta["key"] != expected_key:
        raise CacheError(path, f"holds key {meta['key'][:16]}…, not {expected_key[:16]}…")
    try:
        pieces = []
        for pm in meta["pieces"]:
            entries = {}
            for label, ref in pm["entries"].items():
                digest = ref["blob"]
                if not isinstance(digest, str) or not KEY_RE.match(digest):
                    raise ValueError(f"bad blob reference {digest!r}")
                bpath = blob_dir / digest
                entries[label] = decode_blob(bpath, read_trusted(bpath, "blob"), digest)
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

    filename = meta.get("filename") or synthetic_filename(meta["key"])
    code_obj, origin = None, "source"
    if "code" in sections and meta.get("code_tag") is not None and meta["code_tag"] == code_tag():
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
                code_tag(),
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
            consts = pickle.loads(sections["consts"])  # checksummed, owner-only
        except Exception as e:  # any unpickling failure is a damaged artifact
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
    return decode_artifact(path, read_trusted(path), path.parent / BLOBS_DIR)
