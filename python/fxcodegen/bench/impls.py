"""The implementations the bench compares, by name.

Each turns a workload's graph into source, or only reads it:

- ``fxcodegen``: :func:`fxcodegen.generate`;
- ``reference``: :func:`fxcodegen.bench.reference.generate_execution_code` (vLLM's algorithm);
- ``torch.fx``: ``Graph.python_code`` on the stitching graph and on every inlined child;
- ``floor``: :func:`fxcodegen.bench.floor.read_graph`.

Both the in-process timing (:mod:`~fxcodegen.bench.runner`) and the peak-memory child process
(:mod:`~fxcodegen.bench.peak_rss`) look implementations up here, so neither imports the other
for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx

from fxcodegen.bench import floor, reference

__all__ = ["IMPLS", "available_impls", "fxcodegen_error", "implementation"]

IMPLS = ("fxcodegen", "reference", "torch.fx", "floor")


def _fxcodegen(gm: fx.GraphModule) -> Any:
    # Imported at call time: the baselines must still run where the compiled core is missing.
    import fxcodegen

    return fxcodegen.generate(gm)


def _reference(gm: fx.GraphModule) -> Any:
    return reference.generate_execution_code(gm)


def _graphs(gm: fx.GraphModule) -> list[fx.Graph]:
    out = [gm.graph]
    seen: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target not in seen:
            seen.add(node.target)
            child = gm._modules.get(node.target)
            if isinstance(child, fx.GraphModule):
                out += _graphs(child)
    return out


def _torch_fx(gm: fx.GraphModule) -> Any:
    return [g.python_code(root_module="self") for g in _graphs(gm)]


def _floor(gm: fx.GraphModule) -> Any:
    return floor.read_graph(gm)


_FUNCS: dict[str, Callable[[fx.GraphModule], Any]] = {
    "fxcodegen": _fxcodegen,
    "reference": _reference,
    "torch.fx": _torch_fx,
    "floor": _floor,
}


def fxcodegen_error() -> str | None:
    """Why ``import fxcodegen`` fails (the compiled core is missing), or None."""
    try:
        import fxcodegen  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def implementation(name: str) -> Callable[[fx.GraphModule], Any]:
    """The implementation called ``name`` (one of :data:`IMPLS`), available or not: calling
    ``fxcodegen`` without its compiled core raises ``ImportError``."""
    if name not in _FUNCS:
        raise ValueError(f"unknown implementation {name!r} (choose from {', '.join(IMPLS)})")
    return _FUNCS[name]


def available_impls(names: list[str] | tuple[str, ...] = IMPLS) -> dict[str, Callable[..., Any]]:
    """The named implementations that can run here, in order (``fxcodegen`` is left out where
    its compiled core is missing); an unknown name raises ``ValueError``."""
    out = {}
    for name in names:
        fn = implementation(name)
        if name == "fxcodegen" and fxcodegen_error() is not None:
            continue
        out[name] = fn
    return out
