"""``fxcodegen.compile(model, **options)``: trace once, and on a warm start not at all.

``torch.compile(model, backend=fxcodegen.backend(...))`` runs Dynamo in every process, and
Dynamo restarts a trace to specialise float inputs. This path traces a whole model once
with Dynamo's ahead-of-time capture, floats specialised for this trace only, and stores
the traced *program* (Dynamo's bytecode and guards) in the artifact cache beside the
graphs it compiled. A new process finds the program by a key computed without tracing
(:mod:`fxcodegen.program_key`), loads it, and rebuilds each graph from its stored pieces
(:mod:`fxcodegen.stored_graph`): Dynamo does not run.

The guards still protect: a call the loaded guards reject, a traced source file that
changed, or a damaged or missing file each fall back to tracing and compiling, with one
INFO line (a damaged file: one WARNING) saying why; the new trace is stored for the next
process.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import inspect
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.aot_compile import AOTCompiledModel, aot_compile_fullgraph
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._dynamo.hooks import Hooks
from torch._dynamo.utils import dynamo_timed

from fxcodegen import torch_trace
from fxcodegen.backend import Backend
from fxcodegen.cache import Artifact, PieceRecord, compute_key
from fxcodegen.graph_key import global_config_hash
from fxcodegen.program_key import call_signature, model_factors, program_factors
from fxcodegen.report import GraphRecord
from fxcodegen.stored_graph import bind_stored_graph

__all__ = ["CompiledModel", "StitchedGraph", "compile"]

log = logging.getLogger("fxcodegen")

_PROGRAM_PIECE = "program"
"""A program is stored as an artifact with one piece of this name holding Dynamo's
serialized program, so it gets every guarantee graph artifacts get (checksums, owner-only
files, atomic writes, the signed remote store)."""

_graph_loader: contextvars.ContextVar[Callable[[str], Callable[..., Any]] | None] = (
    contextvars.ContextVar("fxcodegen_graph_loader", default=None)
)
"""How :meth:`StitchedGraph.deserialize_compile_artifacts` (called by Dynamo with bytes
only) rebuilds a graph: set by :class:`CompiledModel` while it loads a program."""


class StitchedGraph(SerializableCallable):
    """What the backend hands Dynamo's ahead-of-time capture: the stitching function of one
    graph, serialized as its artifact cache key (the pieces live in the cache)."""

    def __init__(self, fn: Callable[..., Any], key: str) -> None:
        self.fn = fn
        self.key = key
        """The graph's artifact key, ``""`` when it is not stored (then no program is)."""

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: StitchedGraph) -> bytes:
        if not fn.key:
            raise ValueError("its graph is not in the artifact cache")
        return json.dumps({"graph": fn.key}).encode()

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> StitchedGraph:
        load = _graph_loader.get()
        if load is None:
            raise RuntimeError("a stored fxcodegen program is loaded by fxcodegen.compile")
        key = json.loads(data)["graph"]
        if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{64}", key):
            raise ValueError("the program names no graph key")
        return cls(load(key), key)


def _serializable_guards(entries: list[Any]) -> list[bool]:
    """Keep every guard a new process can check: all but those on globals (their scope is
    this process's) and the kinds Dynamo cannot serialize (object identities). The rest,
    such as ``training`` flags, keyword constants and tensor metadata, stay."""
    from torch._dynamo.guards import CheckFunctionManager

    bad = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [
        not (e.is_global or e.guard_type in bad or bad.intersection(e.derived_guard_types or ()))
        for e in entries
    ]


def _import_module_aliases(result: Any) -> None:
    """Dynamo names a module its bytecode reads as ``___module_<name>_<id>_c<n>``, bound
    by object identity in the tracing process; record each by its import name so a new
    process binds it by importing."""
    env = result._artifacts.runtime_env
    by_id = {id(m): name for name, m in list(sys.modules.items()) if m is not None}
    for ref in env.external_refs:
        match = re.fullmatch(r"___module_\w*?_(\d+)_c\d+", ref)
        if match and ref not in env.import_sources and int(match[1]) in by_id:
            env.import_sources[ref] = by_id[int(match[1])]


def _changed_source(aot: AOTCompiledModel) -> str | None:
    """The first module whose traced function source differs from what the program was
    traced from (Dynamo records each inlined function's lines and their hash)."""
    for result in aot.compiled_results:
        for src in result.source_info().inlined_sources:
            try:
                lines = inspect.getsource(importlib.import_module(src.module))
            except (ImportError, OSError, TypeError):
                return src.module
            text = "".join(
                lines.splitlines(keepends=True)[src.firstlineno - 1 : src.lastlineno - 1]
            )
            if hashlib.sha256(text.encode()).hexdigest() != src.checksum:
                return f"{src.module} (lines {src.firstlineno}-{src.lastlineno})"
    return None


def _accepts(aot: AOTCompiledModel, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    for result in aot.compiled_results:
        try:
            if result.guard_check(aot.model, *args, **kwargs):
                return True
        except Exception:  # a guard that cannot evaluate rejects
            continue
    return False


def _rejection(aot: AOTCompiledModel, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The first failing guard of the first result, as Dynamo reports it."""
    result = aot.compiled_results[0]
    try:
        f_locals = result.prepare_f_locals(aot.model, *args, **kwargs)
        info = result._live_guard_manager().check_verbose(f_locals)
        parts = [p.strip() for p in info.verbose_code_parts if p.strip()]
    except Exception as e:  # the reason is for a log line only
        return f"{type(e).__name__}: {e}"
    return (parts[0] if parts else "a guard failed")[:200]


@dataclass
class Program:
    """One stored program: what a call of one signature runs."""

    key: str
    factors: dict[str, Any]
    aot: AOTCompiledModel | None = None
    how: str = ""
    """``"loaded"`` or ``"traced"`` (the last time it changed)."""
    seconds: float = 0.0
    """Seconds loading or tracing (with compiling) it."""
    graphs: list[GraphRecord] = field(default_factory=list)

    def summary(self) -> str:
        return f"program {self.key[:16]}: {self.how} in {self.seconds:.2f}s, " + (
            f"{len(self.graphs)} graph(s)"
        )


class CompiledModel:
    """``model`` compiled piecewise by :func:`compile`; call it like the model.

    Each call signature (see :mod:`fxcodegen.program_key`) gets one :class:`Program`,
    loaded from the cache when stored there, else traced once and stored. The backend and
    its per-graph records are :attr:`backend` and :attr:`graphs`."""

    def __init__(self, model: torch.nn.Module, backend: Backend) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"fxcodegen.compile expects an nn.Module, got {type(model).__name__}")
        self.model = model
        self.backend = backend
        self.programs: dict[str, Program] = {}
        """The programs by call signature."""
        self._current: AOTCompiledModel | None = None
        self._model_part: dict[str, Any] | None = None
        self._tracing: Program | None = None
        self._trace_started = 0.0
        self._fallback: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return f"fxcodegen.compile({type(self.model).__name__}, {self.backend!r})"

    @property
    def graphs(self) -> list[GraphRecord]:
        return self.backend.graphs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fallback is not None:
            return self._fallback(*args, **kwargs)
        aot = self._current
        if aot is not None:
            try:
                return aot(*args, **kwargs)
            except RuntimeError:
                if _accepts(aot, args, kwargs):
                    raise  # the model's own error, not a guard's
        run = self._program_for(args, kwargs)
        if isinstance(run, AOTCompiledModel):
            self._current = run
        return run(*args, **kwargs)

    # finding the program of a call ------------------------------------------------------
    def _program_for(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Callable[..., Any]:
        signature = call_signature(args, kwargs)
        prog = self.programs.get(signature)
        if prog is None:
            if self._model_part is None:
                self._model_part = model_factors(self.model)
            factors = program_factors(
                self._model_part, signature, self.backend, global_config_hash()
            )
            prog = Program(compute_key(factors), factors)
            self.programs[signature] = prog
            self._load(prog)
        if prog.aot is not None and _accepts(prog.aot, args, kwargs):
            return prog.aot
        if prog.aot is not None:
            log.info(
                "fxcodegen: program %s: its guards reject this call (%s); tracing it",
                prog.key[:16],
                _rejection(prog.aot, args, kwargs),
            )
        try:
            self._trace(prog, args, kwargs)
        except torch._dynamo.exc.Unsupported as e:
            return self._without_capture(e)
        self._store(prog)
        assert prog.aot is not None
        return prog.aot

    def _without_capture(self, e: Exception) -> Callable[..., Any]:
        """A model Dynamo cannot capture whole runs through ``torch.compile`` with the
        backend (traced in every process, floats specialised for its traces)."""
        log.warning(
            "fxcodegen.compile: %s cannot be captured as one graph (%s); using "
            "torch.compile with the backend, which traces in every process",
            type(self.model).__name__,
            str(e).splitlines()[0] if str(e) else type(e).__name__,
        )
        compiled = torch.compile(self.model, backend=self.backend, dynamic=True)

        def run(*args: Any, **kwargs: Any) -> Any:
            with torch._dynamo.config.patch(specialize_float=True):
                return compiled(*args, **kwargs)

        self._fallback = run
        return run

    def _load(self, prog: Program) -> None:
        cache, coop = self.backend.cache, self.backend.coop
        if cache is None or coop is None or not cache.usable():
            return
        t0 = time.perf_counter()
        coop.fill(prog.key)
        art = cache.load(prog.key)
        if art is None:
            reason = cache.explain_miss(prog.key, prog.factors)
            torch_trace.program_decision(prog.key, "miss", reason)
            log.info("%s; tracing", reason)
            return
        first = len(self.backend.graphs)
        token = _graph_loader.set(self._load_graph)
        try:
            data = {p.name: p for p in art.pieces}[_PROGRAM_PIECE].entries["aot"]
            # Inductor's loaders report to a timed region, as they do inside Dynamo.
            with dynamo_timed("fxcodegen.load_program", log_pt2_compile_event=True):
                aot = AOTCompiledModel.deserialize(self.model, bytes(data))
            changed = _changed_source(aot)
        except LookupError as e:  # a graph it names is missing (a damaged one was warned)
            log.info("fxcodegen: program %s unusable: %s; tracing", prog.key[:16], e)
            del self.backend.graphs[first:]
            return
        except Exception as e:  # any failure to load: trace afresh
            log.warning(
                "fxcodegen cache: cannot use program %s (%s: %s); tracing afresh and replacing it",
                prog.key[:16],
                type(e).__name__,
                e,
            )
            del self.backend.graphs[first:]
            return
        finally:
            _graph_loader.reset(token)
        if changed is not None:
            log.info(
                "fxcodegen: program %s: the source of %s changed since it was traced; tracing",
                prog.key[:16],
                changed,
            )
            del self.backend.graphs[first:]
            return
        coop.publish(prog.key)  # when the remote store lacks it
        torch_trace.program_decision(prog.key, "hit")
        prog.aot, prog.how, prog.seconds = aot, "loaded", time.perf_counter() - t0
        prog.graphs = self.backend.graphs[first:]
        for record in prog.graphs:
            record.program_key, record.program_s = prog.key, prog.seconds
        log.info("fxcodegen: %s", prog.summary())

    def _load_graph(self, key: str) -> Callable[..., Any]:
        cache, coop = self.backend.cache, self.backend.coop
        assert cache is not None and coop is not None
        coop.fill(key)
        art = cache.load(key)
        if art is None:
            raise LookupError(f"its graph {key[:16]} is not in the cache")
        coop.publish(key)
        fn, record = bind_stored_graph(art, len(self.backend.graphs))
        self.backend.graphs.append(record)
        return fn

    # tracing -------------------------------------------------------------------------
    def _trace(self, prog: Program, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        first = len(self.backend.graphs)
        self._tracing, self._trace_started = prog, t0
        try:
            # Floats specialised for this trace only: a piece compiled by Inductor cannot
            # return a Python float, and asking afterwards would make Dynamo trace again.
            with torch._dynamo.config.patch(specialize_float=True):
                result = aot_compile_fullgraph(
                    self.model.forward,
                    (tuple(args), dict(kwargs)),
                    Hooks(guard_filter_fn=_serializable_guards),
                    self._compile_graph,
                    dynamic=True,
                )
        finally:
            self._tracing = None
        _import_module_aliases(result)
        if prog.aot is None:
            prog.aot = AOTCompiledModel(self.model, [result])
        else:
            prog.aot.compiled_results.append(result)
        prog.how, prog.seconds = "traced", time.perf_counter() - t0
        prog.graphs += self.backend.graphs[first:]
        log.info("fxcodegen: %s", prog.summary())

    def _compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> StitchedGraph:
        """The backend Dynamo's capture calls: fxcodegen's pipeline, then the graph's key."""
        started = time.perf_counter()
        with torch_trace.compile_context(gm):
            fn = self.backend(gm, example_inputs)
        record = self.backend.graphs[-1]
        prog = self._tracing
        if prog is not None:
            record.program_key = prog.key
        if record.trace_s is None:  # Dynamo's frame callbacks do not see this capture
            record.trace_s = record.entered_at - self._trace_started
        cache = self.backend.cache
        stored = (
            cache is not None
            and record.cache in ("miss", "hit", "healed")
            and cache.artifact_path(record.cache_key).exists()
        )
        log.debug("graph %d: compiled in %.2fs", record.index, time.perf_counter() - started)
        return StitchedGraph(fn, record.cache_key if stored else "")

    def _store(self, prog: Program) -> None:
        cache, coop = self.backend.cache, self.backend.coop
        if cache is None or coop is None or prog.aot is None:
            return
        try:
            data = prog.aot.serialize()
        except Exception as e:  # not storable: run it, trace next time
            log.info("fxcodegen: program %s not stored: %s: %s", prog.key[:16], type(e).__name__, e)
            return
        art = Artifact(
            code="",
            submod_names=[],
            consts=[],
            pieces=[PieceRecord(name=_PROGRAM_PIECE, entries={"aot": data})],
            extra={"program": [r.cache_key for r in prog.graphs]},
        ).prepare(prog.key, prog.factors)
        if cache.store(prog.key, prog.factors, art) is not None:
            coop.publish(prog.key, force=True)


def compile(model: torch.nn.Module, **options: Any) -> CompiledModel:
    """Compile ``model`` piecewise, tracing it once, and not at all on a warm start.

    Takes :class:`fxcodegen.backend`'s options and is used like
    ``torch.compile(model, backend=fxcodegen.backend(**options), dynamic=True)``; the
    result is called like the model. Each call signature's traced program is stored in
    the artifact cache (``cache_dir``, and ``remote_cache`` behind it), so a new process
    with the same model code, config and options loads it without running Dynamo.
    ``docs/cache.md`` says what its key covers. The whole forward is captured as one
    graph: a model with graph breaks needs ``torch.compile`` with the backend instead.
    """
    return CompiledModel(model, Backend(**options))
