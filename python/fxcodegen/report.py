"""What the backend records and shows: a :class:`GraphRecord` per graph (counts and
timings), the Dynamo trace time, the first-run timing, the progress display and, under
``TORCH_TRACE``, each graph's artifacts (:mod:`fxcodegen.torch_trace`)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from fxcodegen import torch_trace
from fxcodegen.piecewise import Entry, PiecewiseBackend
from fxcodegen.split import SplitItem

if TYPE_CHECKING:
    from fxcodegen.cache import Artifact

__all__ = [
    "trace_graph",
    "trace_stored_graph",
    "GraphRecord",
    "Progress",
    "mark_returned",
    "progress_env",
    "timing_first_run",
    "trace_seconds",
    "watch_dynamo",
]

log = logging.getLogger("fxcodegen")


@dataclass
class GraphRecord:
    """What the backend did with one graph Dynamo handed it, and how long each step took.

    Timings (seconds): ``trace_s`` (Dynamo's trace, from the start of its frame compile to
    the backend call; ``None`` when unknown), ``split_s``, ``key_s`` (the cache key),
    ``compile_s`` (compiling, loading and reusing every piece-entry) of which
    ``compile_by_kind`` (seconds compiling entries of each kind: ``"range"``, ``"size"``,
    ``"static"``) and ``load_s`` (loading artifacts), ``codegen_s`` (generating or binding
    the stitching function) and ``first_run_s`` (the graph's first call, which includes
    Inductor's runtime autotuning where any happens; ``None`` until then).
    """

    index: int
    entered_at: float
    """``time.perf_counter()`` when the backend was called (Dynamo's trace ends here)."""
    symbolic: bool
    """Whether the graph had symbolic inputs (else it was specialised to one size)."""
    trace_s: float | None = None
    split_s: float = 0.0
    compile_s: float = 0.0
    compile_by_kind: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0
    codegen_s: float = 0.0
    first_run_s: float | None = None
    num_pieces: int = 0
    num_splitting: int = 0
    num_entries: int = 0
    compiled: int = 0
    reused: int = 0
    """Piece-entries served by an identical piece's compile."""
    shared: int = 0
    """Piece-entries served by another entry of the same piece (the compiler is given the
    same for both)."""
    loaded: int = 0
    cache: str = "off"
    """What the artifact cache did: ``"abandoned"`` (Dynamo was asked to trace again with
    float inputs specialised: nothing was compiled for this graph), ``"off"``
    (``cache_dir=False``), ``"bypassed"``
    (compiler without artifacts), ``"untrusted"`` (directory not trusted), ``"unkeyable"``
    (the graph holds objects without a stable identity), ``"miss"`` (compiled, stored
    unless not storable), ``"hit"`` (loaded) or ``"healed"`` (loaded artifact unusable:
    compiled afresh and replaced)."""
    cache_key: str = ""
    key_s: float = 0.0
    """Seconds spent computing the cache key."""
    dispatch_symbol: Any = None
    """The size the compile ranges apply to (:class:`fxcodegen.graph_inputs.RangeDim`: the
    argument and dimension, and its symbol or, where it is static, its value)."""
    split_gm: torch.fx.GraphModule | None = None
    items: list[SplitItem] = field(default_factory=list)
    pieces: dict[str, PiecewiseBackend] = field(default_factory=dict)
    code: str = ""
    """The generated stitching source."""
    obtained: str = ""
    """How the graph was obtained: ``"traced and compiled"``, ``"traced and loaded"``
    (Dynamo traced it, the cache held its pieces) or ``"loaded without a trace"`` (a
    stored program of :func:`fxcodegen.compile` held it); ``""`` while in progress."""
    program_key: str = ""
    """The key of the stored program this graph belongs to (:func:`fxcodegen.compile`)."""
    program_s: float = 0.0
    """Seconds loading that program (its bytecode and guards), when it was loaded."""
    miss_reason: str = ""
    """On a cache miss under ``TORCH_TRACE``: what differed from the nearest stored key."""

    def timings(self) -> str:
        """The timings as one line of text."""
        kinds = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(self.compile_by_kind.items()))
        if self.obtained == "loaded without a trace":
            trace = f"none (program loaded in {self.program_s:.3f}s)"
        else:
            trace = "?" if self.trace_s is None else f"{self.trace_s:.3f}s"
        first = "not yet" if self.first_run_s is None else f"{self.first_run_s:.3f}s"
        return (
            f"trace {trace}, split {self.split_s:.3f}s, key {self.key_s:.3f}s, "
            f"compile {self.compile_s:.2f}s ({kinds or 'nothing compiled'}), "
            f"load {self.load_s:.2f}s, "
            f"{'bind' if self.cache == 'hit' else 'codegen'} {self.codegen_s:.4f}s, "
            f"first run {first}"
        )

    def summary(self) -> str:
        return (
            f"graph {self.index} ({'symbolic' if self.symbolic else 'static'}): "
            f"{self.num_pieces} pieces ({self.num_splitting} splitting, inlined), "
            f"{self.num_entries} piece-entries: {self.compiled} compiled, {self.reused} reused, "
            f"{self.shared} shared, {self.loaded} loaded; cache {self.cache}"
            + (f" {self.cache_key[:16]}" if self.cache_key else "")
            + (f"; {self.obtained}" if self.obtained else "")
            + (f" (program {self.program_key[:16]})" if self.program_key else "")
            + f"; {self.timings()}"
        )


_dynamo_marks: list[float] = [0.0, 0.0]
"""``time.perf_counter()`` when Dynamo last started compiling a frame, and when a backend
last returned to it."""


def _on_dynamo_start(_args: Any) -> None:
    _dynamo_marks[0] = time.perf_counter()


def trace_seconds(entered_at: float) -> float | None:
    """How long Dynamo traced before the backend was called at ``entered_at``: since it
    started on the frame, or since a backend last returned to it (a restarted trace, a
    second graph of the same frame). ``None`` when unknown (a reset dropped the callback)."""
    since = max(_dynamo_marks)
    if watch_dynamo() and 0.0 < since <= entered_at:
        return entered_at - since
    return None


def mark_returned() -> None:
    """Note that a backend returned to Dynamo now."""
    _dynamo_marks[1] = time.perf_counter()


def watch_dynamo() -> bool:
    """Have Dynamo report when it starts compiling a frame (``torch._dynamo.reset()`` drops
    the callback, so every backend and every graph re-registers it). Returns whether it
    was registered already."""
    handler = torch._dynamo.callback_handler
    if _on_dynamo_start in handler.start_callbacks:
        return True
    handler.register_start_callback(_on_dynamo_start)
    return False


def progress_env() -> bool | None:
    """``FXCODEGEN_PROGRESS``: ``"1"`` on, ``"0"`` off, unset or ``""`` automatic (None)."""
    value = os.environ.get("FXCODEGEN_PROGRESS")
    if value in (None, ""):
        return None
    if value not in ("0", "1"):
        raise ValueError(
            f"FXCODEGEN_PROGRESS={value!r} is not understood: use 1 (show a progress bar), "
            "0 (log lines only) or leave it unset (a bar when stderr is a terminal)"
        )
    return value == "1"


class Progress:
    """Piece-entries done out of the total: a tqdm bar on stderr when enabled, an INFO
    log line per entry otherwise."""

    def __init__(self, total: int, enabled: bool, graph: int) -> None:
        self.total = total
        self.graph = graph
        self.done = 0
        self.bar = (
            tqdm(
                total=total,
                file=sys.stderr,
                desc=f"fxcodegen graph {graph}",
                unit=" piece-entries",
                bar_format="{desc}: {bar:20} {n_fmt}/{total_fmt} piece-entries "
                "[{elapsed}] {postfix}",
                leave=True,
            )
            if enabled and total > 0
            else None
        )

    def start(self, piece: str, entry: Entry) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{piece} [{entry}]")
        else:
            log.info(
                "graph %d: %s [%s] (%d/%d)", self.graph, piece, entry, self.done + 1, self.total
            )

    def step(self, piece: str, entry: Entry, how: str) -> None:
        self.done += 1
        log.debug("%s [%s]: %s (%d/%d)", piece, entry, how, self.done, self.total)
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str("")
            self.bar.close()


def timing_first_run(fn: Callable[..., Any], record: GraphRecord) -> Callable[..., Any]:
    """``fn``, timing its first successful call into ``record.first_run_s`` and logging
    the graph's summary and timings then (one INFO line per graph)."""
    pending = True

    def run(*args: Any) -> Any:
        nonlocal pending
        if not pending:
            return fn(*args)
        t0 = time.perf_counter()
        with torch_trace.phase("fxcodegen.first_run", graph=record.index):
            out = fn(*args)
        record.first_run_s = time.perf_counter() - t0
        pending = False
        log.info("fxcodegen: %s", record.summary())
        return out

    return run


# --------------------------------------------------------------------------------------
# Under TORCH_TRACE: each graph's stitching source, plan and cache decision


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


def trace_stored_graph(
    record: GraphRecord, art: Artifact, hows: dict[tuple[str, str], str]
) -> None:
    """The artifacts of a graph rebuilt from ``art`` without a trace; ``hows`` says how
    each (piece, entry label) was obtained."""
    if not torch_trace.enabled():
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
        return torch_trace.dump(_plan_head(record) | {"pieces": pieces})

    _emit(record, plan)


def trace_graph(record: GraphRecord) -> None:
    """The stitching source, plan and cache decision of a graph the backend compiled."""
    if torch_trace.enabled():
        _emit(record, lambda: torch_trace.dump(_plan(record)))


def _emit(record: GraphRecord, plan: Callable[[], str]) -> None:
    torch_trace.artifact(
        "fxcodegen_stitching_code", lambda: f"# graph {record.index}\n{record.code}"
    )
    torch_trace.artifact("fxcodegen_plan", plan, "json")
    torch_trace.artifact(
        "fxcodegen_cache",
        lambda: torch_trace.dump(
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
