"""What the cache stores: a compiled graph (:class:`Artifact`) and its compiled pieces
(:class:`PieceRecord`), and the canonical form of the values that go into it and its key.

How an artifact is laid out in bytes is :mod:`fxcodegen.cache.format`'s.
"""

from __future__ import annotations

import hashlib
import math
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxcodegen.cache.layout import FORMAT_VERSION

__all__ = [
    "DEFAULT_FN_NAME",
    "Artifact",
    "PieceRecord",
    "canonical",
    "sha256",
    "synthetic_filename",
]

DEFAULT_FN_NAME = "execution_fn"

_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


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
    """Set False (e.g. when a piece's compiled result could not be exported) to have the
    backend use it without storing it. Not stored."""
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
        self.factors = canonical(dict(factors))
        self.filename = synthetic_filename(key)
        if self.code_object is None or self.code_object.co_filename != self.filename:
            self.code_object = compile(self.code, self.filename, "exec")
            self.code_origin = "source"
        return self

    @property
    def num_entries(self) -> int:
        return sum(len(p.entries) for p in self.pieces)


def synthetic_filename(key: str) -> str:
    """The file name the code object of the artifact stored under ``key`` is compiled under."""
    return f"<fxcodegen-cache-{key[:16]}>"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(value: Any) -> Any:
    """A JSON value that is equal across processes for equal inputs (no addresses)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(v) for v in value), key=repr)
    if hasattr(value, "start") and hasattr(value, "end"):  # a Range
        return [canonical(value.start), canonical(value.end)]
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{value.__module__}.{value.__qualname__}"
    return _ADDRESS_RE.sub("", repr(value))
