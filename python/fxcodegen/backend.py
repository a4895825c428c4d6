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

import hashlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from fxcodegen.cache import Artifact, Cache, PieceRecord, compute_key, make_factors, open_cache
from fxcodegen.cache.coop import open_coop, plan
from fxcodegen.cache.remote import open_remote
from fxcodegen.entries import entry_config
from fxcodegen.keys import (
    KEY_VERSION,
    config_repr,
    entry_key,
    split_graph_key,
    structural_key_stable,
)
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


_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


def _global_config_hash() -> str:
    """A hash of the global Inductor and functorch configs (what Inductor's own cache keys
    on), so that changing e.g. ``torch._inductor.config.max_autotune`` is a miss."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = [
        sorted(inductor_config.save_config_portable().items()),
        sorted(functorch_config.save_config_portable().items()),
    ]
    return "sha256:" + hashlib.sha256(_ADDRESS_RE.sub("", repr(parts)).encode()).hexdigest()


def _device_factors(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """What the compiled code depends on about the machine: the CPU's vector ISA (Inductor's
    C++ kernels are built for it) and, for CUDA inputs, the CUDA version and capabilities."""
    out: dict[str, Any] = {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    devices = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            v = node.meta.get("example_value", node.meta.get("val"))
            if isinstance(v, torch.Tensor):
                devices.add(v.device)
    cuda = sorted((d for d in devices if d.type == "cuda"), key=str)
    if cuda:
        out["cuda"] = str(torch.version.cuda)
        out["cuda_capability"] = {str(d): list(torch.cuda.get_device_capability(d)) for d in cuda}
    return out


def _piece_record(name: str, piece: PiecewiseBackend) -> PieceRecord:
    """What the cache stores for one compiled piece (raises if it cannot be exported)."""
    exported = piece.export_artifacts()
    return PieceRecord(
        name=name,
        entries={e.label: exported[piece.entry_keys[e]] for e in piece.entries},
        sym_shape_indices=tuple(piece.sym_shape_indices),
        returns_tuple=piece.returns_tuple,
        compile_ranges=tuple((e.start, e.end) for e in piece.entries if e.kind == "range"),
        compile_sizes=tuple(e.start for e in piece.entries if e.kind == "size"),
        extra={"struct_key": piece.struct_key},
    )


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
            to, e.g. ``("input_ids", 1)``; default: the last symbolic dimension of the first
            tensor input (the tokens). Other symbolic sizes stay dynamic in every entry.
        remote_cache: ``redis://host:port/db`` of a fleet-wide artifact store behind the
            local cache (default ``$FXCODEGEN_REMOTE_CACHE``; needs ``redis``), also used to
            split a cold compile between replicas (``docs/cache.md``).
        cache_secret: the shared secret that signs every remote object (default
            ``$FXCODEGEN_CACHE_SECRET``); without one the remote store is not used.
        remote_timeout: seconds bounding every Redis operation (default 2).

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
        if isinstance(cache_dir, bool):
            self.cache_dir: str | bool | None = None if cache_dir else False
        else:
            self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        """The ``cache_dir`` argument: a path, ``None`` (the default directory) or ``False``."""
        self.cache: Cache | None = None
        """The artifact cache, or None: disabled (``cache_dir=False``) or a compiler without
        artifacts to store (``"eager"`` bypasses the cache)."""
        if compiler == "inductor":
            self.cache = open_cache(self.cache_dir)
        self.coop = open_coop(
            self.cache, open_remote(remote_cache, cache_secret, timeout=remote_timeout)
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

    def _progress_enabled(self) -> bool:
        if self.progress is not None:
            return self.progress
        if self.progress_env is not None:
            return self.progress_env
        return sys.stderr.isatty()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        record = GraphRecord(len(self.graphs), time.perf_counter(), has_symbols(gm))
        record.trace_s = trace_seconds(record.entered_at)
        try:
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

        record.dispatch_symbol = dispatch_symbol(gm, self.range_dim)
        t0 = time.perf_counter()
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
                fn = self._through_cache(record, split_gm, to_compile)
            elif self.compiler != "inductor":
                record.cache = "bypassed"
            if fn is None:
                pieces, gen = self._compile_and_generate(record, split_gm, to_compile)
                t0 = time.perf_counter()
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
        return timing_first_run(fn, record)

    # the cold path ---------------------------------------------------------------------
    def _compile_and_generate(
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

        before = counters.copy()
        t0 = time.perf_counter()
        total = sum(self._num_entries(it.graph, record) for it in to_compile)
        progress = Progress(total, self._progress_enabled(), record.index)
        pieces: dict[str, PiecewiseBackend] = {}
        try:
            for it in to_compile:
                piece = PiecewiseBackend(
                    it.graph,
                    compile_ranges=self.compile_ranges,
                    compile_sizes=self.compile_sizes,
                    compiler=self.compiler,
                    name=it.submod_name,
                    pool=self.pool,
                    artifacts=artifacts,
                    inductor_config=self.inductor_config,
                    before_entry=lambda e, n=it.submod_name: progress.start(n, e),
                    on_entry=lambda e, how, n=it.submod_name: progress.step(n, e, how),
                    dispatch_symbol=record.dispatch_symbol,
                )
                pieces[it.submod_name] = piece
                # Replace the child: a non-GraphModule child is called, not inlined.
                setattr(split_gm, it.submod_name, piece)
        finally:
            progress.close()
        record.pieces = pieces
        record.num_entries = sum(len(p.entries) for p in pieces.values())
        record.compile_s = time.perf_counter() - t0
        add_entry_times(record, pieces)
        log.info(
            "graph %d: compiled %d piece-entries with %s in %.2fs (%d compiles, %d reused, "
            "%d shared, %d loaded)",
            record.index,
            record.num_entries,
            self.compiler,
            record.compile_s,
            counters["compile"] - before["compile"],
            counters["compile_reused"] - before["compile_reused"],
            counters["compile_shared"] - before["compile_shared"],
            counters["artifact_loaded"] - before["artifact_loaded"],
        )

        t0 = time.perf_counter()
        gen = codegen.generate(split_gm)
        counters["codegen"] += 1
        record.codegen_s = time.perf_counter() - t0
        record.code = gen.code
        log.info(
            "graph %d: generated the stitching function in %.4fs", record.index, record.codegen_s
        )
        return pieces, gen

    # the cache -------------------------------------------------------------------------
    def cache_factors(
        self,
        split_gm: torch.fx.GraphModule,
        to_compile: list[SplitItem],
        dispatch_symbol: Any = None,
    ) -> tuple[dict[str, Any], bool]:
        """``(factors, stable)`` of a split graph whose pieces are not compiled yet.

        Beyond :func:`fxcodegen.cache.make_factors` (serialized node list, splitting ops,
        ranges, sizes, compiler and options, versions), ``extra`` holds: ``pieces`` (each
        compiled piece's :func:`structural_key`: placeholder shapes/strides/dtypes/devices,
        ops, literals and the content of tensors the piece holds, which Inductor bakes in),
        ``values`` (:func:`split_graph_key`: the same over the whole split graph, i.e. every
        value the stitching code's pool bakes in, tensors by content), the global Inductor
        config's hash, ``entry_config`` (with a callable ``inductor_config``: the patches
        it gives each piece's entries, by label) and the device factors. Parameters passed as graph inputs are not
        baked in, so their values are not in the key. ``stable`` is False when a part is
        keyed by object identity (then the graph is not cached).
        """
        from fxcodegen import codegen

        piece_keys: dict[str, str] = {}
        entry_configs: dict[str, dict[str, Any]] = {}
        stable = True
        for it in to_compile:
            piece_keys[it.submod_name], ok = structural_key_stable(it.graph)
            stable = stable and ok
            if callable(self.inductor_config):
                entries = plan_entries(
                    it.graph,
                    compile_ranges=self.compile_ranges,
                    compile_sizes=self.compile_sizes,
                    dispatch_symbol=dispatch_symbol,
                )[0]
                entry_configs[it.submod_name] = {
                    e.label: config_repr(entry_config(self.inductor_config, e)) for e in entries
                }
        values, ok = split_graph_key(split_gm, piece_keys)
        stable = stable and ok
        factors = make_factors(
            graph=codegen.serialize(split_gm),
            splitting_ops=self.splitting_ops,
            compile_ranges=self.compile_ranges,
            compile_sizes=self.compile_sizes,
            compiler=self.compiler,
            compiler_options={
                "config_patches": "per entry"
                if callable(self.inductor_config)
                else self.inductor_config
            },
            extra={
                "key_version": KEY_VERSION,
                "pieces": piece_keys,
                "values": values,
                "inductor_config": _global_config_hash(),
                **({"entry_config": entry_configs} if entry_configs else {}),
                "range_dim": list(self.range_dim) if self.range_dim else None,
                "devices": _device_factors(split_gm),
            },
        )
        return factors, stable

    def _through_cache(
        self,
        record: GraphRecord,
        split_gm: torch.fx.GraphModule,
        to_compile: list[SplitItem],
    ) -> Callable[..., Any] | None:
        """The stitching function through the cache, or None to compile without it."""
        cache = self.cache
        assert cache is not None and self.coop is not None  # open_coop gives one per cache
        if not cache.usable():  # warns (once) naming the reason
            record.cache = "untrusted"
            return None
        t0 = time.perf_counter()
        try:
            factors, stable = self.cache_factors(split_gm, to_compile, record.dispatch_symbol)
            key = compute_key(factors)
        except Exception as e:  # noqa: BLE001 - the cache must never break compiling
            log.warning(
                "fxcodegen cache: graph %d not cached: cannot compute its key (%s: %s)",
                record.index,
                type(e).__name__,
                e,
            )
            record.cache = "unkeyable"
            return None
        record.key_s = time.perf_counter() - t0
        if not stable:
            log.info(
                "graph %d: not cached: it holds objects keyed by identity (closures, local "
                "functions, fake tensors or unpicklable constants)",
                record.index,
            )
            record.cache = "unkeyable"
            return None
        record.cache_key = key
        made: dict[str, dict[str, PiecewiseBackend]] = {}

        def create(artifacts: Mapping[str, bytes] | None = None) -> Artifact:
            pieces, gen = self._compile_and_generate(record, split_gm, to_compile, artifacts)
            made["pieces"] = pieces
            art = Artifact(
                code=gen.code,
                submod_names=list(gen.submod_names),
                consts=list(gen.consts),
                extra={"symbolic": record.symbolic},
            )
            try:
                art.pieces = [_piece_record(name, p) for name, p in pieces.items()]
            except Exception as e:  # noqa: BLE001 - an unexportable piece: use, don't store
                log.warning(
                    "fxcodegen cache: graph %d (%s) is not stored: a piece could not be "
                    "exported (%s: %s)",
                    record.index,
                    key[:16],
                    type(e).__name__,
                    e,
                )
                art.storable = False
            return art

        art, loaded = self._cooperate(record, key, factors, create, to_compile)
        if loaded:
            try:
                fn = self._bind_loaded(record, art, split_gm, to_compile, factors)
            except Exception as e:  # noqa: BLE001 - any failure to load: compile afresh
                log.warning(
                    "fxcodegen cache: cannot use artifact %s (%s: %s); compiling afresh and "
                    "replacing it",
                    art.path,
                    type(e).__name__,
                    e,
                )
                art = self._recreate(key, factors, create)
                record.cache = "healed"
                if art.storable:
                    self.coop.publish(key, force=True)
            else:
                record.cache = "hit"
                return fn
        else:
            record.cache = "miss"
        t0 = time.perf_counter()
        fn = art.execution_fn(made["pieces"])
        record.codegen_s += time.perf_counter() - t0
        return fn

    def _cooperate(
        self,
        record: GraphRecord,
        key: str,
        factors: dict[str, Any],
        create: Callable[[Mapping[str, bytes] | None], Artifact],
        to_compile: list[SplitItem],
    ) -> tuple[Artifact, bool]:
        """Like ``Cache.get_or_create``, but a miss is compiled together with the other
        processes compiling the same graph (:mod:`fxcodegen.cache.coop`), entry by entry,
        and the artifact is also kept in the remote store. Returns ``(artifact, loaded)``."""
        coop, cache = self.coop, self.cache
        assert coop is not None and cache is not None
        coop.fill(key)  # from the remote store, when this directory lacks it
        art = cache.load(key, factors)
        if art is not None:
            coop.publish(key)  # when the remote store lacks it
            return art, True
        work = plan(
            {it.submod_name: it.graph for it in to_compile},
            compile_ranges=self.compile_ranges,
            compile_sizes=self.compile_sizes,
            inductor_config=self.inductor_config,
            dispatch_symbol=record.dispatch_symbol,
            pool=self.pool,
        )
        t0 = time.perf_counter()
        others, _ = coop.gather(work)
        gather_s = time.perf_counter() - t0
        art = create(others).prepare(key, factors)
        record.compile_s += gather_s
        if not art.storable:
            log.info("fxcodegen cache: %s is not storable; not stored", key[:16])
        elif coop.read_only:
            log.info("fxcodegen cache: %s not stored: the cache cannot be locked", key[:16])
        elif cache.store(key, factors, art) is not None:
            coop.publish(key, force=True)
        return art, False

    def _recreate(
        self, key: str, factors: dict[str, Any], create: Callable[[], Artifact]
    ) -> Artifact:
        """Compile afresh under the key's lock and replace the stored artifact."""
        import filelock

        assert self.cache is not None
        try:
            with self.cache.locked(key):
                art = create().prepare(key, factors)
                if art.storable:
                    self.cache.store(key, factors, art)
                return art
        except filelock.Timeout:
            return create().prepare(key, factors)

    def _bind_loaded(
        self,
        record: GraphRecord,
        art: Artifact,
        split_gm: torch.fx.GraphModule,
        to_compile: list[SplitItem],
        factors: Mapping[str, Any],
    ) -> Callable[..., Any]:
        """Rebuild every piece from ``art`` (nothing compiled) and bind its code object.

        Raises on anything unusable; then counters and the shared pool are as before."""
        t0 = time.perf_counter()
        snapshot = counters.copy()
        scratch = self.pool.copy()  # merged into self.pool only on success
        piece_keys = factors["extra"]["pieces"]
        progress = Progress(
            sum(len(p.entries) for p in art.pieces), self._progress_enabled(), record.index
        )
        try:
            stored = {p.name: p for p in art.pieces}
            names = [it.submod_name for it in to_compile]
            if sorted(stored) != sorted(names):
                raise ValueError(f"it holds pieces {sorted(stored)}, the graph has {names}")
            pieces: dict[str, PiecewiseBackend] = {}
            for it in to_compile:
                rec = stored[it.submod_name]
                artifacts = {}
                for label, data in rec.entries.items():
                    entry = Entry.from_label(label)
                    patches = entry_config(self.inductor_config, entry)
                    key = entry_key(piece_keys[it.submod_name], entry, self.compiler, patches)
                    artifacts[key] = data
                piece = PiecewiseBackend(
                    it.graph,
                    compile_ranges=self.compile_ranges,
                    compile_sizes=self.compile_sizes,
                    compiler=self.compiler,
                    name=it.submod_name,
                    pool=scratch,
                    artifacts=artifacts,
                    compile_missing=False,
                    inductor_config=self.inductor_config,
                    before_entry=lambda e, n=it.submod_name: progress.start(n, e),
                    on_entry=lambda e, how, n=it.submod_name: progress.step(n, e, how),
                    dispatch_symbol=record.dispatch_symbol,
                )
                if (
                    sorted(e.label for e in piece.entries) != sorted(rec.entries)
                    or piece.sym_shape_indices != list(rec.sym_shape_indices)
                    or piece.returns_tuple != rec.returns_tuple
                ):
                    raise ValueError(f"{it.submod_name}: the stored dispatch data differs")
                pieces[it.submod_name] = piece
            compile_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            fn = art.execution_fn(pieces)  # raises CodegenError for unbound pool slots
        except BaseException:
            for name in ("artifact_loaded", "compile_reused", "compile_shared", "compile"):
                counters[name] = snapshot[name]
            raise
        finally:
            progress.close()
        self.pool.update(scratch)
        for name, piece in pieces.items():
            setattr(split_gm, name, piece)
        record.pieces = pieces
        record.num_entries = sum(len(p.entries) for p in pieces.values())
        record.compile_s = compile_s
        add_entry_times(record, pieces)
        record.codegen_s = time.perf_counter() - t1
        record.code = art.code
        log.info(
            "graph %d: loaded %d piece-entries (%d artifacts) in %.2fs and bound the stitching "
            "code (%s) in %.4fs",
            record.index,
            record.num_entries,
            counters["artifact_loaded"] - snapshot["artifact_loaded"],
            record.compile_s,
            art.code_origin,
            record.codegen_s,
        )
        return fn

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
