"""The ``torch.compile`` backend: split, compile every piece for every entry, stitch.

``torch.compile(model, backend=fxcodegen.backend(splitting_ops=[...]), dynamic=True)``:
Dynamo hands over its graph; it is split at the splitting ops (:func:`fxcodegen.split_graph`);
each non-splitting piece becomes a :class:`fxcodegen.PiecewiseBackend` (compiled for every
range and size right away; identical pieces share results); splitting pieces stay plain
GraphModules, which fxcodegen inlines; the stitching function comes from
:func:`fxcodegen.codegen.generate` and is what Dynamo runs.

With the artifact cache (``cache_dir``, see ``docs/cache.md``) each graph is keyed before
anything is compiled; a hit rebuilds every piece from its stored Inductor artifacts (no
compile) and binds the stored code object of the stitching function (no generation, no
``compile()`` of source). ``compiler="eager"`` bypasses the cache: it has nothing compiled to
store.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from fxcodegen import torch_trace
from fxcodegen.cache import Cache, open_cache
from fxcodegen.cache.coop import open_coop
from fxcodegen.cache.options import check_cache_dir
from fxcodegen.cache.remote import open_remote
from fxcodegen.graph_cache import through_cache
from fxcodegen.piecewise import (
    COMPILERS,
    CompiledPool,
    Entry,
    PiecewiseBackend,
    counters,
    plan_entries,
)
from fxcodegen.ranges import normalize_ranges, normalize_sizes
from fxcodegen.records import (
    GraphRecord,
    Progress,
    add_entry_times,
    mark_returned,
    progress_env,
    timing_first_run,
    trace_seconds,
    watch_dynamo,
)
from fxcodegen.split import SplitItem, resolve_splitting_ops, split_graph
from fxcodegen.traced import check_range_dim, dispatch_symbol, has_symbols, unspecialized_floats

__all__ = ["Backend", "GraphRecord", "backend"]

log = logging.getLogger("fxcodegen")


InductorConfig = Mapping[str, Any] | Callable[[Entry], Mapping[str, Any]] | None


class Backend:
    """A ``torch.compile`` backend that compiles piecewise and stitches with fxcodegen.

    Args:
        splitting_ops: the ops to split at: ``torch.ops`` operators (``"ns::op"``,
            ``"ns::op.overload"`` or the object) and torch functions (the object or its dotted
            name); an ``aten`` name also matches its function form, so
            ``"aten::scaled_dot_product_attention"`` splits at
            ``torch.nn.functional.scaled_dot_product_attention`` (``docs/piecewise.md``).
            The pieces between them are compiled, the splitting pieces run as they are.
        compile_ranges: ``Range``s or ``(start, end)`` pairs of the dynamic size compiled
            with dynamic shapes; default one range covering every size.
        compile_sizes: single sizes compiled with static shapes (checked first).
        compiler: ``"inductor"`` or ``"eager"``.
        cache_dir: the artifact cache directory (``docs/cache.md``); ``None``:
            ``$FXCODEGEN_CACHE_DIR``, else ``~/.cache/fxcodegen``; ``False`` disables it.
            Only ``"inductor"`` uses it (``"eager"`` has nothing compiled to store).
        inductor_config: Inductor config patches, or a callable ``entry -> dict`` giving
            each entry (:class:`fxcodegen.piecewise.Entry`: ``kind``, ``start``, ``end``,
            ``label``) its own, e.g. max-autotune for single sizes only. The entry keys and
            the cache key cover the patches each entry gets.
        progress: show a progress bar while compiling (tqdm on stderr); else one INFO log
            line per piece-entry. Default: ``FXCODEGEN_PROGRESS`` (``1`` on, ``0`` off; any
            other non-empty value is a ``ValueError``), else when stderr is a terminal.
        range_dim: ``(argument name, dimension)`` of the size the ranges and sizes apply
            to, e.g. ``("input_ids", 1)``; default: the tokens of the first tensor argument.
            No other size is dispatched on; they stay dynamic in every entry. A graph where
            it is static (a decode step) gets the one entry covering that size.
        remote_cache: ``redis://host:port/db`` of a fleet-wide artifact store behind the
            local cache (default ``$FXCODEGEN_REMOTE_CACHE``; needs ``redis``), also used to
            split a cold compile between replicas (``docs/cache.md``).
        cache_secret: the shared secret that signs every remote object (default
            ``$FXCODEGEN_CACHE_SECRET``); without one the remote store is not used.
        remote_timeout: seconds bounding every Redis operation, start to end (default 2).
        claim_wait: seconds a cold start waits in all for entries other processes have
            claimed before compiling them itself (default 900).

    Every entry is compiled when Dynamo hands over the graph, never at call time. Keeps a
    :class:`GraphRecord` per graph in :attr:`graphs` and one :class:`CompiledPool` shared by
    all its graphs.
    """

    def __init__(
        self,
        *,
        splitting_ops: Iterable[Any],
        compile_ranges: Iterable[Any] | None = None,
        compile_sizes: Iterable[int] = (),
        compiler: str = "inductor",
        cache_dir: str | os.PathLike[str] | bool | None = None,
        inductor_config: InductorConfig = None,
        progress: bool | None = None,
        range_dim: tuple[str, int] | None = None,
        remote_cache: str | None = None,
        cache_secret: str | bytes | None = None,
        remote_timeout: float | None = None,
        claim_wait: float | None = None,
    ) -> None:
        self.progress_env = progress_env()  # a bad value fails here
        watch_dynamo()
        if compiler not in COMPILERS:
            raise ValueError(f"unknown compiler {compiler!r}; choose one of {COMPILERS}")
        # Unknown names fail here, not mid-trace.
        self.splitting = resolve_splitting_ops(splitting_ops)
        self.splitting_ops = list(self.splitting.names)
        """The canonical names of the splitting ops (what keys and logs show)."""
        self.range_dim = check_range_dim(range_dim)
        self.compile_ranges = None if compile_ranges is None else normalize_ranges(compile_ranges)
        self.compile_sizes = normalize_sizes(compile_sizes)
        if self.compile_ranges == [] and not self.compile_sizes:
            raise ValueError(
                "compile_ranges is empty and there are no compile_sizes: a graph with a "
                "dynamic size would have nothing to run; give a range (or leave "
                "compile_ranges=None for one covering every size) or a size"
            )
        self.compiler = compiler
        self.cache_dir: str | bool | None = check_cache_dir(cache_dir)
        """The ``cache_dir`` argument: a path, ``None`` (the default directory) or ``False``."""
        self.cache: Cache | None = None
        """The artifact cache, or None: disabled (``cache_dir=False``) or a compiler without
        artifacts to store (``"eager"`` bypasses the cache)."""
        if compiler == "inductor":
            self.cache = open_cache(self.cache_dir)
        self.coop = open_coop(
            self.cache,
            open_remote(remote_cache, cache_secret, timeout=remote_timeout),
            wait_s=claim_wait,
        )
        """Cooperative compile and the remote store (:mod:`fxcodegen.cache.coop`), or None
        without a local cache."""
        if inductor_config is not None and not (
            callable(inductor_config) or isinstance(inductor_config, Mapping)
        ):
            raise TypeError(
                "inductor_config must be a dict of Inductor config patches or a callable "
                f"entry -> dict, got {type(inductor_config).__name__}"
            )
        self.inductor_config: InductorConfig = (
            inductor_config if callable(inductor_config) else dict(inductor_config or {})
        )
        """Inductor config patches, or a callable giving each entry its own."""
        self.progress = progress
        self.pool = CompiledPool()
        self.graphs: list[GraphRecord] = []

    def __repr__(self) -> str:
        return (
            f"fxcodegen.backend(splitting_ops={self.splitting_ops!r}, "
            f"compile_ranges={self.compile_ranges!r}, compile_sizes={self.compile_sizes!r}, "
            f"compiler={self.compiler!r}, cache_dir={self.cache_dir!r})"
        )

    def progress_enabled(self) -> bool:
        """Whether a cold start shows a progress bar (else log lines)."""
        if self.progress is not None:
            return self.progress
        if self.progress_env is not None:
            return self.progress_env
        return sys.stderr.isatty()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        record = GraphRecord(len(self.graphs), time.perf_counter(), has_symbols(gm))
        record.trace_s = trace_seconds(record.entered_at)
        try:
            with torch_trace.phase("fxcodegen.backend", graph=record.index):
                return self._handle(record, gm)
        finally:
            mark_returned()

    def _handle(self, record: GraphRecord, gm: torch.fx.GraphModule) -> Callable[..., Any]:
        from fxcodegen import codegen  # needs the compiled core

        self.graphs.append(record)
        before = counters.copy()
        floats = unspecialized_floats(gm)
        if floats:
            # Dynamo made float inputs symbolic; a compiled piece would have to specialise
            # them anyway, by making Dynamo trace again. Asking for that before compiling
            # anything keeps every graph the same whatever Inductor's own cache holds.
            from torch._dynamo.exc import TensorifyScalarRestartAnalysis
            from torch._dynamo.symbolic_convert import TensorifyState

            for name in floats:
                TensorifyState.specialize(name)
            record.cache = "abandoned"
            log.info(
                "graph %d: abandoned: Dynamo traces again with float inputs %s specialised",
                record.index,
                ", ".join(floats),
            )
            raise TensorifyScalarRestartAnalysis

        record.dispatch_symbol = dispatch_symbol(
            gm, self.range_dim, self.compile_ranges, self.compile_sizes
        )
        t0 = time.perf_counter()
        with torch_trace.phase("fxcodegen.split", graph=record.index):
            split_gm, items = split_graph(gm, self.splitting, graph_name=f"graph {record.index}")
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
        to_compile = [it for it in items if not it.is_splitting_graph]

        from torch._dynamo.exc import RestartAnalysis

        fn = None
        try:
            if self.cache is not None:
                fn = through_cache(self, record, split_gm, to_compile)
            elif self.compiler != "inductor":
                record.cache = "bypassed"
            if fn is None:
                pieces, gen = self.compile_and_generate(record, split_gm, to_compile)
                t0 = time.perf_counter()
                with torch_trace.phase("fxcodegen.codegen", graph=record.index):
                    fn = codegen.compile_execution_fn(
                        gen.code, dict(pieces), gen.submod_names, gen.consts
                    )
                record.codegen_s += time.perf_counter() - t0
        except RestartAnalysis:
            # A compiler asked Dynamo to trace again (e.g. to specialise a float): what this
            # graph compiled is thrown away with it.
            record.cache = "abandoned"
            log.info("graph %d: abandoned: a compiler asked Dynamo to trace again", record.index)
            raise

        record.compiled = counters["compile"] - before["compile"]
        record.reused = counters["compile_reused"] - before["compile_reused"]
        record.shared = counters["compile_shared"] - before["compile_shared"]
        record.loaded = counters["artifact_loaded"] - before["artifact_loaded"]
        record.obtained = "traced and loaded" if record.cache == "hit" else "traced and compiled"
        torch_trace.graph_artifacts(record)
        return timing_first_run(fn, record)

    # the cold path ---------------------------------------------------------------------
    def compile_and_generate(
        self,
        record: GraphRecord,
        split_gm: torch.fx.GraphModule,
        to_compile: list[SplitItem],
        artifacts: Mapping[str, bytes] | None = None,
    ) -> tuple[dict[str, PiecewiseBackend], Any]:
        """Compile every piece for every entry (loading those in ``artifacts``), put them in
        ``split_gm`` and generate the stitching code (``counters["codegen"]``). Returns
        ``(pieces, Generated)``."""
        from fxcodegen import codegen

        t0 = time.perf_counter()
        total = sum(self._num_entries(it.graph, record) for it in to_compile)
        progress = Progress(total, self.progress_enabled(), record.index)
        pieces: dict[str, PiecewiseBackend] = {}
        try:
            for it in to_compile:
                piece = self.piece(it, record, progress, self.pool, artifacts)
                pieces[it.submod_name] = piece
                # Replace the child: a non-GraphModule child is called, not inlined.
                setattr(split_gm, it.submod_name, piece)
        finally:
            progress.close()
        record.pieces = pieces
        record.num_entries = sum(len(p.entries) for p in pieces.values())
        record.compile_s = time.perf_counter() - t0
        add_entry_times(record, pieces)
        hows = collections.Counter(h for p in pieces.values() for h in p.how.values())
        log.info(
            "graph %d: %d piece-entries with %s in %.2fs (%d compiled, %d reused, %d shared, "
            "%d loaded)",
            record.index,
            record.num_entries,
            self.compiler,
            record.compile_s,
            hows["compiled"],
            hows["reused"],
            hows["shared"],
            hows["loaded"],
        )

        t0 = time.perf_counter()
        with torch_trace.phase("fxcodegen.codegen", graph=record.index):
            gen = codegen.generate(split_gm)
        counters["codegen"] += 1
        record.codegen_s = time.perf_counter() - t0
        record.code = gen.code
        log.info(
            "graph %d: generated the stitching function in %.4fs", record.index, record.codegen_s
        )
        return pieces, gen

    def piece(
        self,
        it: SplitItem,
        record: GraphRecord,
        progress: Progress,
        pool: CompiledPool,
        artifacts: Mapping[str, bytes] | None = None,
        compile_missing: bool = True,
    ) -> PiecewiseBackend:
        """The :class:`PiecewiseBackend` of one piece with this backend's settings, reporting
        each entry to ``progress``."""
        return PiecewiseBackend(
            it.graph,
            compile_ranges=self.compile_ranges,
            compile_sizes=self.compile_sizes,
            compiler=self.compiler,
            name=it.submod_name,
            pool=pool,
            artifacts=artifacts,
            compile_missing=compile_missing,
            inductor_config=self.inductor_config,
            before_entry=lambda e: progress.start(it.submod_name, e),
            on_entry=lambda e, how: progress.step(it.submod_name, e, how),
            dispatch_symbol=record.dispatch_symbol,
        )

    def _num_entries(self, gm: torch.fx.GraphModule, record: GraphRecord) -> int:
        entries = plan_entries(
            gm,
            compile_ranges=self.compile_ranges,
            compile_sizes=self.compile_sizes,
            dispatch_symbol=record.dispatch_symbol,
        )[0]
        return len(entries)


backend = Backend
"""``fxcodegen.backend(...)`` is :class:`Backend` itself: one signature, documented there."""
