"""fxcodegen's work where ``torch.compile`` users look: ``TORCH_TRACE`` and ``TORCH_LOGS``.

Under ``TORCH_TRACE=dir`` each graph leaves three artifacts in the structured trace
(rendered by ``tlparse``): ``fxcodegen_stitching_code`` (the stitching source),
``fxcodegen_plan`` (pieces, splitting pieces, entries and how each was obtained) and
``fxcodegen_cache`` (the cache decision, its key and, on a miss, what differed from the
nearest stored key); every phase (split, key, each entry's compile or load, codegen or
bind, the first run) is a ``dynamo_timed`` event named ``fxcodegen.*`` in the timeline.
Payloads are built only when a trace is being written; the graph artifacts' payloads are
:mod:`fxcodegen.report`'s.

``TORCH_LOGS="+fxcodegen"`` (or ``fxcodegen``) shows fxcodegen's log lines like any
torch component's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from torch._dynamo.utils import dynamo_timed
from torch._logging import trace_structured
from torch._logging._internal import LazyTraceHandler, log_registry, register_log, trace_log

__all__ = [
    "artifact",
    "compile_context",
    "enabled",
    "phase",
    "program_decision",
    "dump",
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


def program_decision(key: str, decision: str, reason: str = "") -> None:
    """The cache decision on a stored program of :func:`fxcodegen.compile`."""
    payload = {"program": key, "decision": decision, **({"miss": reason} if reason else {})}
    artifact("fxcodegen_program_cache", lambda: dump(payload), "json")


def dump(obj: Any) -> str:
    """``obj`` as the JSON text of a trace artifact."""
    return json.dumps(obj, indent=1, default=str)
