"""The ``torch.compile`` backend: checks its options, then runs each graph Dynamo hands over
through the pipeline.

``torch.compile(model, backend=fxcodegen.backend(splitting_ops=[...]), dynamic=True)``: each
graph goes through :func:`fxcodegen.pipeline.compile_graph` (split at the splitting ops, plan,
key, obtain every piece-entry, build the pieces, stitch), whose stitching function is what
Dynamo runs. The backend keeps what its graphs share: the checked options
(:class:`~fxcodegen.settings.Settings`), the artifact cache (``cache_dir``, see
``docs/cache.md``), the pool of compiled entries and a record per graph.
"""

from __future__ import annotations

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
from fxcodegen.graph_inputs import check_range_dim
from fxcodegen.obtain import CompiledPool, count
from fxcodegen.pipeline import compile_graph
from fxcodegen.plan import COMPILERS, InductorConfig
from fxcodegen.ranges import normalize_ranges, normalize_sizes
from fxcodegen.report import (
    GraphRecord,
    mark_returned,
    progress_env,
    timing_first_run,
    trace_graph,
    watch_dynamo,
)
from fxcodegen.settings import Settings
from fxcodegen.split import resolve_splitting_ops

__all__ = ["Backend", "GraphRecord", "backend"]

log = logging.getLogger("fxcodegen")


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
            count=count,
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
        self.settings = Settings(
            splitting=self.splitting,
            compile_ranges=self.compile_ranges,
            compile_sizes=self.compile_sizes,
            compiler=compiler,
            inductor_config=self.inductor_config,
            range_dim=self.range_dim,
            cache=self.cache,
            coop=self.coop,
        )
        """What the pipeline (:func:`fxcodegen.pipeline.compile_graph`) reads."""

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
        entered_at = time.perf_counter()
        index = len(self.graphs)
        try:
            with torch_trace.phase("fxcodegen.backend", graph=index):
                out = compile_graph(
                    self.settings,
                    gm,
                    index=index,
                    entered_at=entered_at,
                    pool=self.pool,
                    progress=self.progress_enabled(),
                )
                self.graphs.append(out.record)
                if out.error is not None:
                    raise out.error
                assert out.fn is not None
                trace_graph(out.record)
                return timing_first_run(out.fn, out.record)
        finally:
            mark_returned()


backend = Backend
"""``fxcodegen.backend(...)`` is :class:`Backend` itself: one signature, documented there."""
