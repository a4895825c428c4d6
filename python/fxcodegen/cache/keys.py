"""The cache key: the factors that determine a compiled graph, their hash, and how two
sets of factors differ (what a miss logs)."""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fxcodegen.cache.artifact import canonical, sha256
from fxcodegen.cache.layout import FORMAT_VERSION

__all__ = ["build_files", "compute_key", "explain_difference", "fxcodegen_build", "make_factors"]


_NOT_IN_OUTPUT = frozenset(
    ["__main__.py", "cli.py", "cache_cli.py", "demo.py", "models.py", "toy.py"]
)
"""Modules that cannot change what is compiled or generated (the command line, the demo,
the model builders; ``bench/`` too): editing them keeps every user's cache."""


@functools.lru_cache(maxsize=1)
def fxcodegen_build() -> tuple[str, str]:
    """(version, hash of the package's modules that shape its output and of the compiled
    core): a development build that changes what is generated changes the key even when
    the version does not."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        version = dist_version("fxcodegen")
    except PackageNotFoundError:  # not installed: the hash below still identifies it
        version = "unknown"
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]
    for rel in build_files(pkg):
        h.update(rel.encode() + b"\0")
        h.update((pkg / rel).read_bytes())
    return version, h.hexdigest()


def build_files(pkg: Path) -> list[str]:
    """The files of the package at ``pkg`` that :func:`fxcodegen_build` hashes, relative."""
    out = []
    for p in sorted([*pkg.rglob("*.py"), *pkg.glob("_core*")]):
        rel = p.relative_to(pkg).as_posix()
        if p.is_file() and not (rel in _NOT_IN_OUTPUT or rel.startswith("bench/")):
            out.append(rel)
    return out


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
    version, build = fxcodegen_build()
    factors: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "graph": f"sha256:{sha256(graph)}",
        "graph_bytes": len(graph),
        "splitting_ops": sorted(str(op) for op in (splitting_ops or ())),
        "compile_ranges": None
        if compile_ranges is None
        else sorted(canonical(list(compile_ranges))),
        "compile_sizes": sorted({int(s) for s in compile_sizes}),
        "compiler": str(compiler),
        "compiler_options": canonical(compiler_options or {}),
        "fxcodegen": version,
        "fxcodegen_build": build,
        **_torch_versions(),
        "python": f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}",
        "platform": f"{platform.system()}-{platform.machine()}",
    }
    if extra:
        factors["extra"] = canonical(extra)
    return factors


def compute_key(factors: Mapping[str, Any]) -> str:
    """The cache key of ``factors``: sha256 of their canonical JSON (64 hex digits)."""
    text = json.dumps(canonical(factors), sort_keys=True, separators=(",", ":"))
    return sha256(text.encode())


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
