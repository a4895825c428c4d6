"""What a cold start has to have in hand: the distinct piece-entries of a graph
(:class:`Work`), in a stable order, each named by the entry key the cache stores it under
and able to compile itself here (:func:`plan`). :mod:`fxcodegen.cache.coop` shares them
out between processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Work", "plan"]


def _count(name: str, n: int = 1) -> None:
    from fxcodegen.piecewise import counters

    counters[name] += n


@dataclass
class Work:
    """One distinct piece-entry to have in hand: its key and how to compile it here."""

    key: str
    label: str
    compile: Callable[[], bytes]


def plan(
    pieces: Mapping[str, Any],
    *,
    compile_ranges: Any,
    compile_sizes: Any,
    inductor_config: Any,
    dispatch_symbol: Any,
    pool: Any,
    struct_keys: Mapping[str, str] | None = None,
) -> list[Work]:
    """The piece-entries of ``pieces`` (``{name: graph}``) that need a compile, in a stable
    order: one per sharing key (:func:`~fxcodegen.piecewise.compile_key`) not already in
    ``pool``, named by the entry key the cache stores it under. Each compiles into ``pool``,
    unclaimed, so that the piece built afterwards counts it as its own compile.
    ``struct_keys``: each piece's :func:`~fxcodegen.keys.structural_key`, when known."""
    from fxcodegen.entries import compile_entry
    from fxcodegen.piecewise import entry_specs, plan_entries
    from fxcodegen.torch_trace import phase

    work: dict[str, Work] = {}
    for name, graph in pieces.items():
        entries, _, _, symbol = plan_entries(
            graph,
            compile_ranges=compile_ranges,
            compile_sizes=compile_sizes,
            dispatch_symbol=dispatch_symbol,
        )
        struct = (struct_keys or {}).get(name)
        specs = entry_specs(graph, entries, symbol, "inductor", inductor_config, struct)
        for entry, spec in specs.items():
            if spec.compile_key in work or spec.compile_key in pool:
                continue

            def compile_one(
                graph: Any = graph,
                entry: Any = entry,
                spec: Any = spec,
                symbol: Any = symbol,
                name: str = name,
            ) -> bytes:
                t0 = time.perf_counter()
                with phase("fxcodegen.compile_entry", piece=name, entry=entry.label):
                    compiled = compile_entry(
                        graph,
                        compiler="inductor",
                        symbol=symbol,
                        bounds=spec.bounds,
                        config=spec.config,
                        entry=entry,
                        name=name,
                    )
                _count("compile")
                compiled.claimed, compiled.seconds = False, time.perf_counter() - t0
                pool.put(spec.compile_key, compiled)
                return compiled.to_bytes()

            work[spec.compile_key] = Work(spec.key, f"{name} [{entry}]", compile_one)
    return list(work.values())
