"""Benchmarks of fxcodegen against the code generators users would otherwise run.

- :mod:`~fxcodegen.bench.workloads` builds the graphs (deterministic, parameterised by size).
- :mod:`~fxcodegen.bench.reference` is a pure-Python reimplementation of vLLM's algorithm.
- :mod:`~fxcodegen.bench.floor` is the plain loop any Python-side codegen must at least pay.
- :mod:`~fxcodegen.bench.impls` names the implementations compared: fxcodegen, the reference,
  torch.fx and the floor.
- :mod:`~fxcodegen.bench.runner` times them side by side in one process.
- :mod:`~fxcodegen.bench.peak_rss` measures one run's peak memory in a fresh process.
- :mod:`~fxcodegen.bench.call_overhead` times one call of each layout's stitching function.
- :mod:`~fxcodegen.bench.host` records the machine and what a fresh page costs on it.
- :mod:`~fxcodegen.bench.cli` is ``python -m fxcodegen bench``.

Nothing here is imported by ``fxcodegen`` itself.
"""
