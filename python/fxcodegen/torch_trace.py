"""fxcodegen's work where ``torch.compile`` users look: ``TORCH_TRACE`` and ``TORCH_LOGS``.

Under ``TORCH_TRACE=dir`` each graph leaves three artifacts in the structured trace
(rendered by ``tlparse``): ``fxcodegen_stitching_code`` (the stitching source),
``fxcodegen_plan`` (pieces, splitting pieces, entries and how each was obtained) and
``fxcodegen_cache`` (the cache decision, its key and, on a miss, what differed from the
nearest stored key); every phase (split, key, each entry's compile or load, codegen or
bind, the first run) is a ``dynamo_timed`` event named ``fxcodegen.*`` in the timeline.
Payloads are built only when a trace is being written.

``TORCH_LOGS="+fxcodegen"`` (or ``fxcodegen``) shows fxcodegen's log lines like any
torch component's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch._dynamo.utils import dynamo_timed
from torch._logging import trace_structured
from torch._logging._internal import LazyTraceHandler, log_registry, register_log, trace_log

if TYPE_CHECKING:
    from fxcodegen.cache import Artifact
    from fxcodegen.records import GraphRecord

__all__ = [
    "artifact",
    "compile_context",
    "enabled",
    "graph_artifacts",
    "phase",
    "program_decision",
    "stored_plan",
]


def _register_logger() -> None:
    if not log_registry.is_log("fxcodegen"):
        register_log("fxcodegen", "fxcodegen")


_register_logger()


def enabled() -> bool:
    """Whether a structured trace is being written (``TORCH_TRACE``). Torch attaches a lazy
    handler even without it, which writes nothing (off Meta's fleet) and drops itself at
    the first event: that one does not count."""
    return any(
        not isinstance(h, LazyTraceHandler) or h.root_dir is not None or h.stream is not None
        for h in trace_log.handlers
    )


def phase(name: str, **metadata: Any) -> contextlib.AbstractContextManager[None]:
    """A timed phase ``name`` (``fxcodegen.*``) in the trace's timeline, with ``metadata``
    in its event. Without a trace it is only Dynamo's in-memory timing record."""
    return dynamo_timed(name, metadata=metadata or None)


def compile_context(gm: Any) -> contextlib.AbstractContextManager[Any]:
    """The compile context of the Dynamo compile that captured ``gm``, for a backend that
    Dynamo calls outside it (its ahead-of-time capture), so that what the backend traces
    lands with that compile in ``tlparse``'s report."""
    from torch._guards import CompileContext, compile_context

    cid = getattr(gm, "meta", {}).get("dynamo_compile_id")
    if cid is None or CompileContext.current_compile_id() is not None:
        return contextlib.nullcontext()
    return compile_context(CompileContext(cid))


def artifact(name: str, payload: Callable[[], str], encoding: str = "string") -> None:
    """One artifact ``name`` whose text ``payload()`` is computed only under a trace."""
    if not enabled():
        return
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": encoding},
        payload_fn=payload,
        expect_trace_id=False,  # a graph loaded without a trace has no Dynamo compile
    )


def _plan(record: GraphRecord) -> dict[str, Any]:
    pieces: list[dict[str, Any]] = []
    for it in record.items:
        if it.is_splitting_graph:
            pieces.append({"name": it.submod_name, "splitting": True})
            continue
        piece = record.pieces.get(it.submod_name)
        entries = []
        for e in piece.entries if piece is not None else ():
            entries.append(
                {
                    "entry": e.label,
                    "how": piece.how.get(e, ""),
                    "seconds": round(piece.entry_seconds.get(e, 0.0), 4),
                    "bounds": str(piece.bounds.get(e) or "static"),
                }
            )
        pieces.append({"name": it.submod_name, "splitting": False, "entries": entries})
    return _plan_head(record) | {"pieces": pieces}


def _plan_head(record: GraphRecord) -> dict[str, Any]:
    return {
        "graph": record.index,
        "obtained": record.obtained,
        "symbolic": record.symbolic,
        "dispatch": None if record.dispatch_symbol is None else str(record.dispatch_symbol),
        "num_pieces": record.num_pieces,
        "num_splitting": record.num_splitting,
        "num_entries": record.num_entries,
        "compiled": record.compiled,
        "reused": record.reused,
        "shared": record.shared,
        "loaded": record.loaded,
    }


def stored_plan(record: GraphRecord, art: Artifact, hows: dict[tuple[str, str], str]) -> None:
    """The artifacts of a graph rebuilt from ``art`` without a trace; ``hows`` says how
    each (piece, entry label) was obtained."""
    if not enabled():
        return

    def plan() -> str:
        pieces = [
            {
                "name": p.name,
                "splitting": False,
                "entries": [
                    {"entry": label, "how": hows.get((p.name, label), "")} for label in p.entries
                ],
            }
            for p in art.pieces
        ]
        return _dump(_plan_head(record) | {"pieces": pieces})

    _emit(record, plan)


def graph_artifacts(record: GraphRecord) -> None:
    """The stitching source, plan and cache decision of a graph the backend compiled."""
    if enabled():
        _emit(record, lambda: _dump(_plan(record)))


def _emit(record: GraphRecord, plan: Callable[[], str]) -> None:
    artifact("fxcodegen_stitching_code", lambda: f"# graph {record.index}\n{record.code}")
    artifact("fxcodegen_plan", plan, "json")
    artifact(
        "fxcodegen_cache",
        lambda: _dump(
            {
                "graph": record.index,
                "decision": record.cache,
                "key": record.cache_key,
                **({"miss": record.miss_reason} if record.miss_reason else {}),
                **({"program": record.program_key} if record.program_key else {}),
            }
        ),
        "json",
    )


def program_decision(key: str, decision: str, reason: str = "") -> None:
    """The cache decision on a stored program of :func:`fxcodegen.compile`."""
    payload = {"program": key, "decision": decision, **({"miss": reason} if reason else {})}
    artifact("fxcodegen_program_cache", lambda: _dump(payload), "json")


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
