"""The ``torch.compile`` backend: split, compile every piece for every entry, stitch.

``torch.compile(model, backend=fxcodegen.backend(splitting_ops=[...]), dynamic=True)``:
Dynamo hands over its graph; it is split at the splitting ops (:func:`fxcodegen.split_graph`);
each non-splitting piece becomes a :class:`fxcodegen.PiecewiseBackend` (compiled for every
range and size right away; identical pieces share results); splitting pieces stay plain
GraphModules, which fxcodegen inlines; the stitching function comes from
:func:`fxcodegen.codegen.generate` and is what Dynamo runs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from fxcodegen.concrete import fake_args, is_symbolic
from fxcodegen.piecewise import (
    COMPILERS,
    CompiledPool,
    Entry,
    PiecewiseBackend,
    _normalize_ranges,
    _normalize_sizes,
    counters,
)
from fxcodegen.split import SplitItem, resolve_splitting_ops, split_graph

__all__ = ["Backend", "GraphRecord", "backend"]

log = logging.getLogger("fxcodegen")


@dataclass
class GraphRecord:
    """What the backend did with one graph Dynamo handed it."""

    index: int
    entered_at: float
    """``time.perf_counter()`` when the backend was called (Dynamo's trace ends here)."""
    symbolic: bool
    """Whether the graph had symbolic inputs (else it was specialised to one size)."""
    split_s: float = 0.0
    compile_s: float = 0.0
    codegen_s: float = 0.0
    num_pieces: int = 0
    num_splitting: int = 0
    num_entries: int = 0
    compiled: int = 0
    reused: int = 0
    loaded: int = 0
    split_gm: torch.fx.GraphModule | None = None
    items: list[SplitItem] = field(default_factory=list)
    pieces: dict[str, PiecewiseBackend] = field(default_factory=dict)
    code: str = ""
    """The generated stitching source."""

    def summary(self) -> str:
        return (
            f"graph {self.index} ({'symbolic' if self.symbolic else 'static'}): "
            f"{self.num_pieces} pieces ({self.num_splitting} splitting, inlined), "
            f"{self.num_entries} piece-entries: {self.compiled} compiled, {self.reused} reused, "
            f"{self.loaded} loaded; split {self.split_s:.3f}s, compile {self.compile_s:.2f}s, "
            f"codegen {self.codegen_s:.4f}s"
        )


class _Progress:
    """A one-line progress display on stderr (no dependency)."""

    def __init__(self, total: int, enabled: bool, stream: TextIO) -> None:
        self.total = total
        self.enabled = enabled and total > 0
        self.stream = stream
        self.done = 0
        self.how: dict[str, int] = {}
        self.t0 = time.perf_counter()

    def step(self, entry: Entry, how: str, piece: str) -> None:
        self.done += 1
        self.how[how] = self.how.get(how, 0) + 1
        log.debug("%s [%s]: %s (%d/%d)", piece, entry, how, self.done, self.total)
        if self.enabled:
            parts = ", ".join(f"{n} {k}" for k, n in sorted(self.how.items()))
            width = 24
            filled = width * self.done // self.total
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(
                f"\rfxcodegen: [{bar}] {self.done}/{self.total} piece-entries ({parts}) "
                f"{time.perf_counter() - self.t0:.1f}s"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _has_symbols(gm: torch.fx.GraphModule) -> bool:
    return any(is_symbolic(v) for v in fake_args(gm))


class Backend:
    """A ``torch.compile`` backend (see :func:`backend`). Keeps a :class:`GraphRecord` per
    graph in :attr:`graphs` and one :class:`CompiledPool` shared by all its graphs."""

    def __init__(
        self,
        *,
        splitting_ops: Iterable[Any],
        compile_ranges: Iterable[Any] | None = None,
        compile_sizes: Iterable[int] = (),
        compiler: str = "inductor",
        cache_dir: str | os.PathLike[str] | None = None,
        inductor_config: Mapping[str, Any] | None = None,
        progress: bool | None = None,
    ) -> None:
        if compiler not in COMPILERS:
            raise ValueError(f"unknown compiler {compiler!r}; choose one of {COMPILERS}")
        self.splitting_ops = list(splitting_ops) if not isinstance(splitting_ops, str) else None
        if self.splitting_ops is None:
            raise TypeError(
                f"splitting_ops must be a list of op names, not a single string "
                f"({splitting_ops!r}); write [{splitting_ops!r}]"
            )
        resolve_splitting_ops(self.splitting_ops)  # unknown names fail here, not mid-trace
        self.compile_ranges = None if compile_ranges is None else _normalize_ranges(compile_ranges)
        self.compile_sizes = _normalize_sizes(compile_sizes)
        self.compiler = compiler
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        """Where compiled artifacts are cached (wired in by ``fxcodegen.cache``)."""
        self.inductor_config = dict(inductor_config or {})
        self.progress = progress
        self.pool = CompiledPool()
        self.graphs: list[GraphRecord] = []

    def __repr__(self) -> str:
        return (
            f"fxcodegen.backend(splitting_ops={self.splitting_ops!r}, "
            f"compile_ranges={self.compile_ranges!r}, compile_sizes={self.compile_sizes!r}, "
            f"compiler={self.compiler!r}, cache_dir={self.cache_dir!r})"
        )

    def _progress_enabled(self) -> bool:
        if self.progress is not None:
            return self.progress
        if os.environ.get("FXCODEGEN_PROGRESS", "") not in ("", "0"):
            return True
        return sys.stderr.isatty()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from fxcodegen import codegen  # needs the compiled core

        record = GraphRecord(len(self.graphs), time.perf_counter(), _has_symbols(gm))
        self.graphs.append(record)
        before = counters.copy()

        t0 = time.perf_counter()
        split_gm, items = split_graph(gm, self.splitting_ops)
        record.split_s = time.perf_counter() - t0
        record.split_gm, record.items = split_gm, items
        record.num_pieces = len(items)
        record.num_splitting = sum(it.is_splitting_graph for it in items)
        log.info(
            "graph %d: split into %d pieces (%d splitting) in %.3fs",
            record.index,
            record.num_pieces,
            record.num_splitting,
            record.split_s,
        )

        t0 = time.perf_counter()
        to_compile = [it for it in items if not it.is_splitting_graph]
        total = sum(self._num_entries(it.graph) for it in to_compile)
        progress = _Progress(total, self._progress_enabled(), sys.stderr)
        try:
            for it in to_compile:
                piece = PiecewiseBackend(
                    it.graph,
                    compile_ranges=self.compile_ranges,
                    compile_sizes=self.compile_sizes,
                    compiler=self.compiler,
                    name=it.submod_name,
                    pool=self.pool,
                    inductor_config=self.inductor_config,
                    on_entry=lambda e, how, n=it.submod_name: progress.step(e, how, n),
                )
                record.num_entries += len(piece.entries)
                record.pieces[it.submod_name] = piece
                # Replace the child: a non-GraphModule child is called, not inlined.
                setattr(split_gm, it.submod_name, piece)
        finally:
            progress.close()
        record.compile_s = time.perf_counter() - t0
        record.compiled = counters["compile"] - before["compile"]
        record.reused = counters["compile_reused"] - before["compile_reused"]
        record.loaded = counters["artifact_loaded"] - before["artifact_loaded"]
        log.info(
            "graph %d: compiled %d piece-entries with %s in %.2fs (%d compiles, %d reused, "
            "%d loaded)",
            record.index,
            record.num_entries,
            self.compiler,
            record.compile_s,
            record.compiled,
            record.reused,
            record.loaded,
        )

        t0 = time.perf_counter()
        gen = codegen.generate(split_gm)
        fn = codegen.compile_execution_fn(
            gen.code, dict(record.pieces), gen.submod_names, gen.consts
        )
        counters["codegen"] += 1
        record.codegen_s = time.perf_counter() - t0
        record.code = gen.code
        log.info(
            "graph %d: generated the stitching function in %.4fs", record.index, record.codegen_s
        )
        log.info("fxcodegen: %s", record.summary())
        return fn

    def _num_entries(self, gm: torch.fx.GraphModule) -> int:
        if not any(isinstance(v, torch.SymInt) and is_symbolic(v) for v in fake_args(gm)):
            return 1
        ranges = 1 if self.compile_ranges is None else len(self.compile_ranges)
        return ranges + len(self.compile_sizes)


def backend(
    *,
    splitting_ops: Iterable[Any],
    compile_ranges: Iterable[Any] | None = None,
    compile_sizes: Iterable[int] = (),
    compiler: str = "inductor",
    cache_dir: str | os.PathLike[str] | None = None,
    inductor_config: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> Backend:
    """A ``torch.compile`` backend that compiles piecewise and stitches with fxcodegen.

    Args:
        splitting_ops: op names (``"ns::op"`` or ``"ns::op.overload"``) to split at; the
            pieces between them are compiled, the splitting pieces run as they are.
        compile_ranges: ``Range``s or ``(start, end)`` pairs of the dynamic size compiled
            with dynamic shapes; default one range covering every size.
        compile_sizes: single sizes compiled with static shapes (checked first).
        compiler: ``"inductor"`` or ``"eager"``.
        cache_dir: the artifact cache directory (see ``fxcodegen.cache``).
        inductor_config: Inductor config patches.
        progress: show a progress line while compiling (default: when stderr is a TTY or
            ``FXCODEGEN_PROGRESS=1``).

    Every entry is compiled when Dynamo hands over the graph, never at call time.
    """
    return Backend(
        splitting_ops=splitting_ops,
        compile_ranges=compile_ranges,
        compile_sizes=compile_sizes,
        compiler=compiler,
        cache_dir=cache_dir,
        inductor_config=inductor_config,
        progress=progress,
    )
