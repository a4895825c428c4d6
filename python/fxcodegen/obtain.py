"""Obtain every entry of a planned piece: share, reuse, load or compile it.

For each :class:`~fxcodegen.plan.EntryPlan`, in order:

- **shared**: another entry of the same piece has the same sharing key (the compiler is
  told the same for both);
- **compiled** ahead: the cooperative compile of this graph compiled it (:func:`work_items`);
  the first piece to use it counts it as its own compile;
- **reused**: an identical piece of the model compiled it (the :class:`CompiledPool`);
- **loaded**: its artifact bytes are in hand (the cache);
- **compiled** here, unless ``compile_missing=False``.

The outcome of each entry is returned (:class:`Obtained`); :func:`tally` turns outcomes into
counts, which callers add to the process-wide :data:`counters`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fxcodegen import torch_trace
from fxcodegen.cache.work import Work
from fxcodegen.compile_entry import Compiled, compile_entry, load_inductor_artifact, wrap_inductor
from fxcodegen.entries import Entry
from fxcodegen.plan import EntryPlan, PiecePlan

__all__ = [
    "Ahead",
    "CompiledPool",
    "Obtained",
    "count",
    "counters",
    "obtain_piece",
    "tally",
    "work_items",
]

log = logging.getLogger("fxcodegen")

counters: collections.Counter[str] = collections.Counter()
"""Process-wide counts: ``compile`` (calls into a compiler), ``compile_reused``
(piece-entries served by an identical piece's result), ``compile_shared`` (entries served
by another entry of the same piece that the compiler is given the same for),
``artifact_loaded`` (entries loaded from artifact bytes), ``codegen`` (stitching functions
generated), ``remote_loaded`` and ``remote_stored`` (objects read from and written to the
remote store). Reset with ``counters.clear()``."""


def count(name: str) -> None:
    """Add one to ``counters[name]`` (what the cache layer is handed to count with)."""
    counters[name] += 1


_COUNTER = {
    "compiled": "compile",
    "reused": "compile_reused",
    "shared": "compile_shared",
    "loaded": "artifact_loaded",
}


class CompiledPool:
    """Compiled results by sharing key, shared by the pieces of one model so that
    identical compiles happen once."""

    def __init__(self) -> None:
        self._by_key: dict[str, Compiled] = {}

    def get(self, key: str) -> Compiled | None:
        return self._by_key.get(key)

    def put(self, key: str, compiled: Compiled) -> None:
        self._by_key[key] = compiled

    def __len__(self) -> int:
        return len(self._by_key)

    def copy(self) -> CompiledPool:
        """A pool with the same entries (adding to it leaves this one unchanged)."""
        out = CompiledPool()
        out._by_key = dict(self._by_key)
        return out

    def update(self, other: CompiledPool) -> None:
        """Add ``other``'s entries."""
        self._by_key.update(other._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key


@dataclass(frozen=True)
class Obtained:
    """How one entry was obtained."""

    compiled: Compiled
    how: str
    """``"compiled"``, ``"reused"``, ``"shared"`` or ``"loaded"``."""
    seconds: float
    """Spent compiling or loading it (0 for reused and shared)."""


Ahead = dict[str, tuple[Compiled, float]]
"""Entries the cooperative compile compiled ahead of their pieces: sharing key ->
``(result, seconds)``. The first piece to use one takes it out."""


def tally(outcomes: Iterable[Mapping[Entry, Obtained]]) -> collections.Counter[str]:
    """The :data:`counters` names and counts of some pieces' outcomes."""
    out: collections.Counter[str] = collections.Counter()
    for obtained in outcomes:
        for o in obtained.values():
            out[_COUNTER[o.how]] += 1
    return out


def _compile(plan: PiecePlan, ep: EntryPlan) -> Compiled:
    with torch_trace.phase("fxcodegen.compile_entry", piece=plan.name, entry=ep.entry.label):
        return compile_entry(
            plan.graph,
            compiler=plan.compiler,
            symbol=plan.symbol,
            bounds=ep.bounds,
            config=ep.config,
            entry=ep.entry,
            name=plan.name,
        )


def _load(plan: PiecePlan, ep: EntryPlan, data: bytes) -> Compiled:
    with torch_trace.phase("fxcodegen.load_entry", piece=plan.name, entry=ep.entry.label):
        art = load_inductor_artifact(data)
    return Compiled(wrap_inductor(art, plan.returns_tuple), art, data)


def obtain_piece(
    plan: PiecePlan,
    *,
    pool: CompiledPool,
    artifacts: Mapping[str, bytes] | None = None,
    ahead: Ahead | None = None,
    compile_missing: bool = True,
    before_entry: Callable[[Entry], None] | None = None,
    on_entry: Callable[[Entry, str], None] | None = None,
) -> dict[Entry, Obtained]:
    """Every entry of ``plan``, in order (see the module docstring). ``artifacts``: entry key
    -> artifact bytes; ``ahead`` is taken from; ``pool`` gets what is compiled or loaded.
    With ``compile_missing=False`` an entry that would be compiled raises ``KeyError``."""
    out: dict[Entry, Obtained] = {}
    seen: dict[str, Compiled] = {}  # sharing keys this piece holds
    for ep in plan.entries:
        entry, key = ep.entry, ep.compile_key
        if before_entry is not None:
            before_entry(entry)
        t0 = time.perf_counter()
        if key in seen:
            o = Obtained(seen[key], "shared", 0.0)
        elif ahead is not None and key in ahead:
            compiled, seconds = ahead.pop(key)
            o = Obtained(compiled, "compiled", seconds)
        elif (pooled := pool.get(key)) is not None:
            o = Obtained(pooled, "reused", 0.0)
        elif artifacts is not None and ep.key in artifacts:
            compiled = _load(plan, ep, bytes(artifacts[ep.key]))
            o = Obtained(compiled, "loaded", time.perf_counter() - t0)
        elif not compile_missing:
            raise KeyError(
                f"no artifact for {plan.name} [{entry}] (key {ep.key}) and compile_missing=False"
            )
        else:
            compiled = _compile(plan, ep)
            o = Obtained(compiled, "compiled", time.perf_counter() - t0)
        pool.put(key, o.compiled)
        seen[key] = o.compiled
        out[entry] = o
        log.debug(
            "%s %s [%s] (%s) with %s in %.3fs",
            o.how,
            plan.name,
            entry,
            ep.bounds or "static",
            plan.compiler_id,
            o.seconds,
        )
        if on_entry is not None:
            on_entry(entry, o.how)
    return out


def work_items(plans: Iterable[PiecePlan], pool: CompiledPool, ahead: Ahead) -> list[Work]:
    """The distinct Inductor compiles ``plans`` need that ``pool`` lacks, in a stable order,
    one per sharing key, each named by the entry key the cache stores it under. Compiling
    one puts its result in ``ahead`` and returns the artifact bytes."""
    work: dict[str, Work] = {}
    for plan in plans:
        for ep in plan.entries:
            if ep.compile_key in work or ep.compile_key in pool:
                continue

            def compile_one(plan: PiecePlan = plan, ep: EntryPlan = ep) -> bytes:
                t0 = time.perf_counter()
                compiled = _compile(plan, ep)
                ahead[ep.compile_key] = (compiled, time.perf_counter() - t0)
                return compiled.to_bytes()

            work[ep.compile_key] = Work(ep.key, f"{plan.name} [{ep.entry}]", compile_one)
    return list(work.values())
