"""The floor: what any Python-side codegen pays just to read the graph.

A plain loop that reads each node's ``op``, ``name``, ``target``, ``args`` and ``kwargs`` and
formats nothing. Plain GraphModule children are walked too, as codegen inlines them; a
``call_module`` target is looked up in ``_modules`` directly (``getattr`` on a module costs more
than the whole loop body).
"""

from __future__ import annotations

import torch.fx as fx

__all__ = ["read_graph"]


def read_graph(gm: fx.GraphModule) -> int:
    """Read every node of ``gm`` (and of its GraphModule children); return the count."""
    count = 0
    modules = gm._modules
    for node in gm.graph.nodes:
        op = node.op
        node.name  # noqa: B018
        target = node.target
        node.args  # noqa: B018
        node.kwargs  # noqa: B018
        count += 1
        if op == "call_module":
            child = modules.get(target)
            if isinstance(child, fx.GraphModule):
                count += read_graph(child)
    return count
