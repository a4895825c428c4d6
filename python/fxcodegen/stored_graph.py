"""A graph rebuilt from the artifact cache without its trace.

A warm :func:`fxcodegen.compile` has no Dynamo graph to split: the stored program names
each graph's cache key, and this module rebuilds the graph's stitching function from the
artifact alone. Each compiled piece becomes a :class:`StoredPiece`, which loads its
entries' Inductor artifacts (each distinct artifact once) and dispatches on the size the
traced piece dispatched on; the stitching code object is bound to them as on any cache hit.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from fxcodegen import torch_trace
from fxcodegen.cache import Artifact, PieceRecord
from fxcodegen.codegen import bind_stored
from fxcodegen.compile_entry import load_inductor_artifact, wrap_inductor
from fxcodegen.entries import Entry
from fxcodegen.piecewise import counters
from fxcodegen.ranges import SizeTable
from fxcodegen.report import GraphRecord, timing_first_run, trace_stored_graph

__all__ = ["StoredPiece", "bind_stored_graph"]

log = logging.getLogger("fxcodegen")


class StoredPiece:
    """One piece rebuilt from its :class:`~fxcodegen.cache.PieceRecord`: a call picks the
    entry by the size at the recorded argument (and dimension), as the traced piece did.

    ``load(label, data)`` turns an entry's bytes into its callable."""

    def __init__(self, rec: PieceRecord, load: Callable[[str, bytes], Callable[..., Any]]) -> None:
        self.name = rec.name
        entries = {
            Entry.from_label(label): load(label, data) for label, data in rec.entries.items()
        }
        self.index = rec.sym_shape_indices[0] if rec.sym_shape_indices else None
        # Stored by this fxcodegen; an artifact without it cannot be dispatched untraced.
        self.dim = rec.extra["dispatch_dim"]
        self._single: Callable[..., Any] | None = None
        self._table = SizeTable(rec.name)
        if self.index is None:
            if len(entries) != 1:
                raise ValueError(f"{rec.name}: {len(entries)} entries and no dispatch argument")
            self._single = next(iter(entries.values()))
            return
        for entry in sorted(entries):
            if entry.kind == "size":
                self._table.add_size(entry.start, entries[entry])
            elif entry.kind == "range":
                self._table.add_range(entry.start, entry.end, entries[entry])
            else:
                raise ValueError(f"{rec.name}: a static entry beside dispatched ones")

    def __call__(self, *args: Any) -> Any:
        if self._single is not None:
            return self._single(*args)
        size = args[self.index]  # type: ignore[index]
        if self.dim is not None:
            size = size.size(self.dim)
        return self._table.lookup(size)(*args)


def bind_stored_graph(art: Artifact, index: int) -> tuple[Callable[..., Any], GraphRecord]:
    """The stitching function of the stored graph ``art`` (loaded by the caller from the
    cache, checked) and its record (index ``index``). Raises on anything unusable."""
    t0 = time.perf_counter()
    record = GraphRecord(index, t0, bool(art.extra.get("symbolic", True)))
    loaded: dict[str, Callable[..., Any]] = {}
    current: dict[str, Any] = {}  # the piece being rebuilt: its name and return kind
    hows: dict[tuple[str, str], str] = {}

    def load(label: str, data: bytes) -> Callable[..., Any]:
        digest = hashlib.sha256(data).hexdigest()
        key = f"{digest}:{current['tuple']}"
        hows[current["name"], label] = "reused" if key in loaded else "loaded without a trace"
        if key not in loaded:
            with torch_trace.phase("fxcodegen.load_entry", piece=current["name"], entry=label):
                loaded[key] = wrap_inductor(load_inductor_artifact(data), current["tuple"])
            counters["artifact_loaded"] += 1
        return loaded[key]

    pieces: dict[str, StoredPiece] = {}
    for rec in art.pieces:
        current.update(name=rec.name, tuple=rec.returns_tuple)
        pieces[rec.name] = StoredPiece(rec, load)
    record.load_s = record.compile_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    with torch_trace.phase("fxcodegen.bind", graph=index):
        fn = bind_stored(art, pieces)
    record.codegen_s = time.perf_counter() - t1
    record.num_pieces = int(art.extra.get("num_pieces", len(art.pieces)))
    record.num_splitting = int(art.extra.get("num_splitting", 0))
    record.num_entries = art.num_entries
    record.loaded = len(loaded)
    record.reused = art.num_entries - len(loaded)
    record.cache, record.cache_key = "hit", art.key
    record.code = art.code
    record.obtained = "loaded without a trace"
    trace_stored_graph(record, art, hows)
    log.info(
        "graph %d: loaded without a trace: %d piece-entries (%d artifacts) in %.2fs",
        index,
        record.num_entries,
        len(loaded),
        record.load_s,
    )
    return timing_first_run(fn, record), record
