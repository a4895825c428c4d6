"""One graph from Dynamo to the stitching function Dynamo runs.

:func:`compile_graph` runs the steps in order; each step's module holds the detail:

1. **split** the graph at the splitting ops (:mod:`fxcodegen.split`);
2. **plan** every compiled piece once: entries, dispatch location, config patches, keys
   (:mod:`fxcodegen.plan`);
3. **key** the graph from the plans (:mod:`fxcodegen.graph_key`), when the cache is on;
4. **obtain** every piece-entry (:mod:`fxcodegen.obtain`): from the stored artifact (a hit),
   else cooperatively with other processes compiling the same graph
   (:mod:`fxcodegen.cache.coop`), compiling what nobody has;
5. build the **pieces**, which only dispatch (:class:`fxcodegen.PiecewiseBackend`);
6. **stitch**: generate the stitching function (:mod:`fxcodegen.codegen`), or bind the stored
   one; store the artifact on a miss.

Counts and timings go into the returned :class:`~fxcodegen.report.GraphRecord`; the counts
are also added to the process-wide :data:`fxcodegen.counters`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fxcodegen import codegen, torch_trace
from fxcodegen.cache import Artifact, compute_key
from fxcodegen.entries import Entry
from fxcodegen.graph_inputs import RangeDim, dispatch_symbol, has_symbols, unspecialized_floats
from fxcodegen.graph_key import graph_factors
from fxcodegen.obtain import Ahead, CompiledPool, Obtained, counters, obtain_piece, tally
from fxcodegen.obtain import work_items as coop_work
from fxcodegen.piecewise import PiecewiseBackend
from fxcodegen.plan import PiecePlan, plan_piece
from fxcodegen.report import GraphRecord, Progress, trace_seconds
from fxcodegen.settings import Settings
from fxcodegen.split import SplitItem, split_graph

__all__ = ["GraphResult", "compile_graph", "plan_pieces"]

log = logging.getLogger("fxcodegen")

ObtainedEntries = dict[str, dict[Entry, Obtained]]
"""Each piece's obtained entries, by piece name."""


@dataclass
class GraphResult:
    """What :func:`compile_graph` made of one graph."""

    record: GraphRecord
    fn: Callable[..., Any] | None
    """The stitching function; ``None`` on a failure."""
    error: Exception | None = None
    """The failure, for the caller to raise: a request that Dynamo trace again (the graph
    is abandoned) or an error."""


def compile_graph(
    s: Settings,
    gm: torch.fx.GraphModule,
    *,
    index: int,
    entered_at: float,
    pool: CompiledPool,
    progress: bool,
) -> GraphResult:
    """Split, plan, key, obtain, build the pieces and stitch graph ``index``; ``pool`` is
    shared with the backend's other graphs; ``progress``: show a bar (else log lines). A
    failure is returned with the record of what was done, for the caller to raise."""
    from torch._dynamo.exc import RestartAnalysis

    record = GraphRecord(index, entered_at, has_symbols(gm))
    record.trace_s = trace_seconds(entered_at)
    try:
        fn = _steps(s, record, gm, pool, progress)
    except RestartAnalysis as e:
        # Dynamo is asked to trace again (e.g. to specialise a float): what this graph
        # compiled is thrown away with it.
        record.cache = "abandoned"
        log.info(
            "graph %d: abandoned: Dynamo traces it again%s", index, f" ({e})" if str(e) else ""
        )
        return GraphResult(record, None, e)
    except Exception as e:
        return GraphResult(record, None, e)
    record.obtained = "traced and loaded" if record.cache == "hit" else "traced and compiled"
    return GraphResult(record, fn)


def _steps(
    s: Settings,
    record: GraphRecord,
    gm: torch.fx.GraphModule,
    pool: CompiledPool,
    progress: bool,
) -> Callable[..., Any]:
    index = record.index
    floats = unspecialized_floats(gm)
    if floats:
        # Dynamo made float inputs symbolic; a compiled piece would have to specialise
        # them anyway, by making Dynamo trace again. Asking for that before compiling
        # anything keeps every graph the same whatever Inductor's own cache holds.
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        from torch._dynamo.symbolic_convert import TensorifyState

        for name in floats:
            TensorifyState.specialize(name)
        raise TensorifyScalarRestartAnalysis(f"float inputs {', '.join(floats)} specialised")

    # 1. split
    record.dispatch_symbol = dispatch_symbol(gm, s.range_dim, s.compile_ranges, s.compile_sizes)
    t0 = time.perf_counter()
    with torch_trace.phase("fxcodegen.split", graph=index):
        split_gm, items = split_graph(gm, s.splitting, graph_name=f"graph {index}")
    record.split_s = time.perf_counter() - t0
    record.split_gm, record.items = split_gm, items
    record.num_pieces = len(items)
    record.num_splitting = sum(it.is_splitting_graph for it in items)
    log.info(
        "graph %d: split into %d pieces (%d splitting) in %.3fs",
        index,
        record.num_pieces,
        record.num_splitting,
        record.split_s,
    )

    # 2. plan
    plans = plan_pieces(s, items, record.dispatch_symbol)

    # 3. key; 4-6. obtain, pieces, stitch
    run = _Run(s, record, split_gm, plans, pool, progress)
    keyed = run.key()
    return run.through_cache(*keyed) if keyed is not None else run.compile_and_stitch()


def plan_pieces(
    s: Settings, items: list[SplitItem], dispatch: RangeDim | None
) -> dict[str, PiecePlan]:
    """The plan of every compiled (non-splitting) piece, by name."""
    return {
        it.submod_name: plan_piece(
            it.graph,
            name=it.submod_name,
            compiler=s.compiler,
            compile_ranges=s.compile_ranges,
            compile_sizes=s.compile_sizes,
            inductor_config=s.inductor_config,
            dispatch_symbol=dispatch,
        )
        for it in items
        if not it.is_splitting_graph
    }


@dataclass
class _Run:
    """Steps 3 to 6 of one graph (see the module docstring)."""

    s: Settings
    record: GraphRecord
    split_gm: torch.fx.GraphModule
    plans: dict[str, PiecePlan]
    pool: CompiledPool
    progress: bool

    # 3. key ----------------------------------------------------------------------------
    def key(self) -> tuple[str, dict[str, Any]] | None:
        """``(key, factors)`` of the graph, or None to compile without the cache."""
        s, record = self.s, self.record
        if s.cache is None:
            record.cache = "off" if s.compiler == "inductor" else "bypassed"
            return None
        if not s.cache.usable():  # warns (once) naming the reason
            record.cache = "untrusted"
            return None
        t0 = time.perf_counter()
        try:
            with torch_trace.phase("fxcodegen.key", graph=record.index):
                factors, stable = graph_factors(s, self.split_gm, self.plans)
                key = compute_key(factors)
        except Exception as e:  # the cache must never break compiling
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
        return key, factors

    # 4. obtain -------------------------------------------------------------------------
    def obtain(
        self,
        pool: CompiledPool,
        artifacts: Mapping[str, bytes] | None = None,
        ahead: Ahead | None = None,
        compile_missing: bool = True,
    ) -> ObtainedEntries:
        """Every entry of every piece; reported to the progress display."""
        total = sum(len(p.entries) for p in self.plans.values())
        progress = Progress(total, self.progress, self.record.index)
        try:
            return {
                name: obtain_piece(
                    plan,
                    pool=pool,
                    artifacts=artifacts,
                    ahead=ahead,
                    compile_missing=compile_missing,
                    before_entry=lambda e, n=name: progress.start(n, e),
                    on_entry=lambda e, how, n=name: progress.step(n, e, how),
                )
                for name, plan in self.plans.items()
            }
        finally:
            progress.close()

    # 5. pieces -------------------------------------------------------------------------
    def pieces(self, obtained: ObtainedEntries, seconds: float) -> dict[str, PiecewiseBackend]:
        """The pieces, put in the split graph (a non-GraphModule child is called, not
        inlined); the record and :data:`counters` get their counts."""
        record = self.record
        pieces = {n: PiecewiseBackend.from_plan(self.plans[n], o) for n, o in obtained.items()}
        for name, piece in pieces.items():
            setattr(self.split_gm, name, piece)
        counts = tally(obtained.values())
        counters.update(counts)
        record.pieces = pieces
        record.num_entries = sum(len(o) for o in obtained.values())
        record.compiled, record.reused = counts["compile"], counts["compile_reused"]
        record.shared, record.loaded = counts["compile_shared"], counts["artifact_loaded"]
        record.compile_s = seconds
        for entries in obtained.values():
            for entry, o in entries.items():
                if o.how == "compiled":
                    by_kind = record.compile_by_kind
                    by_kind[entry.kind] = by_kind.get(entry.kind, 0.0) + o.seconds
                elif o.how == "loaded":
                    record.load_s += o.seconds
        return pieces

    # 6. stitch -------------------------------------------------------------------------
    def generate(self, obtained: ObtainedEntries, seconds: float) -> codegen.Generated:
        """Build the pieces and generate the stitching code (``counters["codegen"]``)."""
        record = self.record
        self.pieces(obtained, seconds)
        hows = collections.Counter(o.how for obt in obtained.values() for o in obt.values())
        log.info(
            "graph %d: %d piece-entries with %s in %.2fs (%d compiled, %d reused, %d shared, "
            "%d loaded)",
            record.index,
            record.num_entries,
            self.s.compiler,
            record.compile_s,
            hows["compiled"],
            hows["reused"],
            hows["shared"],
            hows["loaded"],
        )
        t0 = time.perf_counter()
        with torch_trace.phase("fxcodegen.codegen", graph=record.index):
            gen = codegen.generate(self.split_gm)
        counters["codegen"] += 1
        record.codegen_s = time.perf_counter() - t0
        record.code = gen.code
        log.info(
            "graph %d: generated the stitching function in %.4fs", record.index, record.codegen_s
        )
        return gen

    def bind(self, bind: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
        t0 = time.perf_counter()
        with torch_trace.phase("fxcodegen.bind", graph=self.record.index):
            fn = bind()
        self.record.codegen_s += time.perf_counter() - t0
        return fn

    def compile_and_stitch(self) -> Callable[..., Any]:
        """Without the cache: compile every entry, generate and compile the stitching code."""
        t0 = time.perf_counter()
        gen = self.generate(self.obtain(self.pool), time.perf_counter() - t0)
        pieces = dict(self.record.pieces)
        return self.bind(
            lambda: codegen.compile_execution_fn(gen.code, pieces, gen.submod_names, gen.consts)
        )

    # through the cache -----------------------------------------------------------------
    def through_cache(self, key: str, factors: dict[str, Any]) -> Callable[..., Any]:
        """A hit binds the stored graph; a miss is compiled with the other processes
        compiling it and stored; an unusable stored graph is compiled afresh and replaced."""
        s, record = self.s, self.record
        assert s.cache is not None and s.coop is not None  # open_coop gives one per cache
        s.coop.fill(key)  # from the remote store, when this directory lacks it
        art = s.cache.load(key, factors)
        if art is not None:
            s.coop.publish(key)  # when the remote store lacks it
            try:
                return self.load_stored(art)
            except Exception as e:  # any failure to load: compile afresh
                log.warning(
                    "fxcodegen cache: cannot use artifact %s (%s: %s); compiling afresh and "
                    "replacing it",
                    art.path,
                    type(e).__name__,
                    e,
                )
            art = self.recreate(key, factors)
            record.cache = "healed"
            if art.storable:
                s.coop.publish(key, force=True)
        else:
            record.cache = "miss"
            if torch_trace.enabled():  # reads every stored key's factors: only for a trace
                record.miss_reason = s.cache.explain_miss(key, factors)
            art = self.store_new(key, factors)
        pieces = dict(record.pieces)
        return self.bind(lambda: codegen.bind_stored(art, pieces))

    def load_stored(self, art: Artifact) -> Callable[..., Any]:
        """Rebuild every piece from ``art`` (nothing compiled) and bind its code object.
        Raises on anything unusable; then the shared pool and the counters are as before."""
        record = self.record
        stored = {p.name: p for p in art.pieces}
        if sorted(stored) != sorted(self.plans):
            raise ValueError(f"it holds pieces {sorted(stored)}, the graph has {list(self.plans)}")
        artifacts = {}
        for name, plan in self.plans.items():
            rec = stored[name]
            if (
                sorted(plan.labels) != sorted(rec.entries)
                or plan.sym_shape_indices != tuple(rec.sym_shape_indices)
                or plan.returns_tuple != rec.returns_tuple
            ):
                raise ValueError(f"{name}: the stored dispatch data differs")
            artifacts.update({ep.key: rec.entries[ep.entry.label] for ep in plan.entries})
        t0 = time.perf_counter()
        scratch = self.pool.copy()  # merged into the shared pool only on success
        obtained = self.obtain(scratch, artifacts, compile_missing=False)
        compile_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        pieces = {n: PiecewiseBackend.from_plan(self.plans[n], o) for n, o in obtained.items()}
        with torch_trace.phase("fxcodegen.bind", graph=record.index):
            fn = codegen.bind_stored(art, pieces)  # raises CodegenError for unbound slots
        self.pool.update(scratch)
        self.pieces(obtained, compile_s)
        record.codegen_s = time.perf_counter() - t1
        record.code = art.code
        record.cache = "hit"
        log.info(
            "graph %d: loaded %d piece-entries (%d artifacts) in %.2fs and bound the stitching "
            "code (%s) in %.4fs",
            record.index,
            record.num_entries,
            record.loaded,
            record.compile_s,
            art.code_origin,
            record.codegen_s,
        )
        return fn

    def make_artifact(self, obtained: ObtainedEntries, seconds: float) -> Artifact:
        """Build the pieces, generate the stitching code and make the graph's artifact (not
        storable when a piece cannot be exported)."""
        record = self.record
        gen = self.generate(obtained, seconds)
        art = Artifact(
            code=gen.code,
            submod_names=list(gen.submod_names),
            consts=list(gen.consts),
            extra={
                "symbolic": record.symbolic,
                "num_pieces": record.num_pieces,
                "num_splitting": record.num_splitting,
            },
        )
        try:
            art.pieces = [p.piece_record() for p in record.pieces.values()]
        except Exception as e:  # an unexportable piece: use, don't store
            log.warning(
                "fxcodegen cache: graph %d (%s) is not stored: a piece could not be "
                "exported (%s: %s)",
                record.index,
                record.cache_key[:16],
                type(e).__name__,
                e,
            )
            art.storable = False
        return art

    def store_new(self, key: str, factors: dict[str, Any]) -> Artifact:
        """A miss: the distinct piece-entries are gathered with the other processes
        compiling this graph (stored by them, or compiled here and stored per entry), then
        the graph's artifact is stored and published."""
        coop, cache = self.s.coop, self.s.cache
        assert coop is not None and cache is not None
        t0 = time.perf_counter()
        ahead: Ahead = {}
        others, _ = coop.gather(coop_work(self.plans.values(), self.pool, ahead))
        obtained = self.obtain(self.pool, others, ahead)
        art = self.make_artifact(obtained, time.perf_counter() - t0).prepare(key, factors)
        if not art.storable:
            log.info("fxcodegen cache: %s is not storable; not stored", key[:16])
        elif coop.read_only:
            log.info("fxcodegen cache: %s not stored: the cache cannot be locked", key[:16])
        elif cache.store(key, factors, art) is not None:
            coop.publish(key, force=True)
        return art

    def recreate(self, key: str, factors: dict[str, Any]) -> Artifact:
        """Compile afresh under the key's lock and replace the stored artifact."""
        import filelock

        cache = self.s.cache
        assert cache is not None

        def compile_all() -> Artifact:
            t0 = time.perf_counter()
            art = self.make_artifact(self.obtain(self.pool), time.perf_counter() - t0)
            return art.prepare(key, factors)

        try:
            with cache.locked(key):
                art = compile_all()
                if art.storable:
                    cache.store(key, factors, art)
                return art
        except filelock.Timeout:
            return compile_all()
