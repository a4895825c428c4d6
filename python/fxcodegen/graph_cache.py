"""One graph through the artifact cache: its key, then a hit (every piece rebuilt from its
stored Inductor artifacts and the stored code object bound: nothing compiled, nothing
generated) or a miss (compiled together with the other processes compiling it, stored,
published to the remote store). The :class:`~fxcodegen.backend.Backend` calls
:func:`through_cache`; ``docs/cache.md`` describes the cache itself."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from fxcodegen import torch_trace
from fxcodegen.cache import Artifact, PieceRecord, compute_key, make_factors
from fxcodegen.cache.coop import plan
from fxcodegen.entries import entry_config
from fxcodegen.keys import (
    KEY_VERSION,
    config_repr,
    entry_key,
    split_graph_key,
    structural_key_stable,
)
from fxcodegen.piecewise import Entry, PiecewiseBackend, counters, plan_entries
from fxcodegen.records import GraphRecord, Progress, add_entry_times
from fxcodegen.split import SplitItem

if TYPE_CHECKING:
    from fxcodegen.backend import Backend

__all__ = ["cache_factors", "global_config_hash", "through_cache"]

log = logging.getLogger("fxcodegen")


_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


def _portable_config(module: Any) -> list[tuple[str, Any]]:
    """A config module's public values, callables and classes by qualified name (what
    ``save_config_portable`` keeps, without its serializers, which import the whole of
    Inductor's lowering: a warm start that compiles nothing should not pay for that)."""
    ignored = ("_", *getattr(module, "_cache_config_ignore_prefix", []))
    out = []
    for name, value in module.get_config_copy().items():
        if name.startswith(ignored):
            continue
        if callable(value):
            value = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        out.append((name, value))
    return sorted(out, key=lambda kv: kv[0])


def global_config_hash() -> str:
    """A hash of the global Inductor and functorch configs (what Inductor's own cache keys
    on), so that changing e.g. ``torch._inductor.config.max_autotune`` is a miss."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = [_portable_config(inductor_config), _portable_config(functorch_config)]
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
        # Where a call's size is read, so a load without a trace can dispatch.
        extra={"struct_key": piece.struct_key, "dispatch_dim": piece.dispatch_dim},
    )


def cache_factors(
    be: Backend,
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
        if callable(be.inductor_config):
            entries = plan_entries(
                it.graph,
                compile_ranges=be.compile_ranges,
                compile_sizes=be.compile_sizes,
                dispatch_symbol=dispatch_symbol,
            )[0]
            entry_configs[it.submod_name] = {
                e.label: config_repr(entry_config(be.inductor_config, e)) for e in entries
            }
    values, ok = split_graph_key(split_gm, piece_keys)
    stable = stable and ok
    factors = make_factors(
        graph=codegen.serialize(split_gm),
        splitting_ops=be.splitting_ops,
        compile_ranges=be.compile_ranges,
        compile_sizes=be.compile_sizes,
        compiler=be.compiler,
        compiler_options={
            "config_patches": "per entry" if callable(be.inductor_config) else be.inductor_config
        },
        extra={
            "key_version": KEY_VERSION,
            "pieces": piece_keys,
            "values": values,
            "inductor_config": global_config_hash(),
            **({"entry_config": entry_configs} if entry_configs else {}),
            "range_dim": list(be.range_dim) if be.range_dim else None,
            "devices": _device_factors(split_gm),
        },
    )
    return factors, stable


def through_cache(
    be: Backend,
    record: GraphRecord,
    split_gm: torch.fx.GraphModule,
    to_compile: list[SplitItem],
) -> Callable[..., Any] | None:
    """The stitching function through the cache, or None to compile without it."""
    cache = be.cache
    assert cache is not None and be.coop is not None  # open_coop gives one per cache
    if not cache.usable():  # warns (once) naming the reason
        record.cache = "untrusted"
        return None
    t0 = time.perf_counter()
    try:
        with torch_trace.phase("fxcodegen.key", graph=record.index):
            factors, stable = cache_factors(be, split_gm, to_compile, record.dispatch_symbol)
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
        pieces, gen = be.compile_and_generate(record, split_gm, to_compile, artifacts)
        made["pieces"] = pieces
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

    art, loaded = _cooperate(be, record, key, factors, create, to_compile)
    if loaded:
        try:
            fn = _bind_loaded(be, record, art, split_gm, to_compile, factors)
        except Exception as e:  # noqa: BLE001 - any failure to load: compile afresh
            log.warning(
                "fxcodegen cache: cannot use artifact %s (%s: %s); compiling afresh and "
                "replacing it",
                art.path,
                type(e).__name__,
                e,
            )
            art = _recreate(be, key, factors, create)
            record.cache = "healed"
            if art.storable:
                be.coop.publish(key, force=True)
        else:
            record.cache = "hit"
            return fn
    else:
        record.cache = "miss"
        if torch_trace.enabled():  # reads every stored key's factors: only for a trace
            record.miss_reason = cache.explain_miss(key, factors)
    t0 = time.perf_counter()
    with torch_trace.phase("fxcodegen.bind", graph=record.index):
        fn = art.execution_fn(made["pieces"])
    record.codegen_s += time.perf_counter() - t0
    return fn


def _cooperate(
    be: Backend,
    record: GraphRecord,
    key: str,
    factors: dict[str, Any],
    create: Callable[[Mapping[str, bytes] | None], Artifact],
    to_compile: list[SplitItem],
) -> tuple[Artifact, bool]:
    """Like ``Cache.get_or_create``, but a miss is compiled together with the other
    processes compiling the same graph (:mod:`fxcodegen.cache.coop`), entry by entry,
    and the artifact is also kept in the remote store. Returns ``(artifact, loaded)``."""
    coop, cache = be.coop, be.cache
    assert coop is not None and cache is not None
    coop.fill(key)  # from the remote store, when this directory lacks it
    art = cache.load(key, factors)
    if art is not None:
        coop.publish(key)  # when the remote store lacks it
        return art, True
    work = plan(
        {it.submod_name: it.graph for it in to_compile},
        compile_ranges=be.compile_ranges,
        compile_sizes=be.compile_sizes,
        inductor_config=be.inductor_config,
        dispatch_symbol=record.dispatch_symbol,
        pool=be.pool,
        struct_keys=factors["extra"]["pieces"],  # computed for the key already
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
    be: Backend, key: str, factors: dict[str, Any], create: Callable[[], Artifact]
) -> Artifact:
    """Compile afresh under the key's lock and replace the stored artifact."""
    import filelock

    assert be.cache is not None
    try:
        with be.cache.locked(key):
            art = create().prepare(key, factors)
            if art.storable:
                be.cache.store(key, factors, art)
            return art
    except filelock.Timeout:
        return create().prepare(key, factors)


def _bind_loaded(
    be: Backend,
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
    scratch = be.pool.copy()  # merged into be.pool only on success
    piece_keys = factors["extra"]["pieces"]
    progress = Progress(
        sum(len(p.entries) for p in art.pieces), be.progress_enabled(), record.index
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
                patches = entry_config(be.inductor_config, entry)
                key = entry_key(piece_keys[it.submod_name], entry, be.compiler, patches)
                artifacts[key] = data
            piece = be.piece(it, record, progress, scratch, artifacts, compile_missing=False)
            if (
                sorted(e.label for e in piece.entries) != sorted(rec.entries)
                or piece.sym_shape_indices != list(rec.sym_shape_indices)
                or piece.returns_tuple != rec.returns_tuple
            ):
                raise ValueError(f"{it.submod_name}: the stored dispatch data differs")
            pieces[it.submod_name] = piece
        compile_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        with torch_trace.phase("fxcodegen.bind", graph=record.index):
            fn = art.execution_fn(pieces)  # raises CodegenError for unbound pool slots
    except BaseException:
        for name in ("artifact_loaded", "compile_reused", "compile_shared", "compile"):
            counters[name] = snapshot[name]
        raise
    finally:
        progress.close()
    be.pool.update(scratch)
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
