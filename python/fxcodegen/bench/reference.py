"""The baseline fxcodegen replaces: vLLM's stitching codegen algorithm, in pure Python.

A fresh reimplementation of the algorithm (not its code), kept faithful where cost is decided:

- liveness from ``node.users``: the last user of each value, by position in the node list;
- one pass over the nodes, each line built with f-strings; arguments formatted recursively;
- an **identity** pool (``id(obj)`` → slot): two equal ``torch.device`` objects take two slots;
- ``del a, b`` after the last use of values not returned;
- plain ``GraphModule`` children inlined as nested functions, recursively, sharing the pool;
- opaque children called as ``__vllm_submods__[i](...)``, bound with ``functools.partial``;
  pool slots read as ``__vllm_consts__[i]``.

Beyond vLLM, so that every workload runs: ``call_method`` and ``get_attr`` nodes, non-int
``getitem`` indices, non-finite floats (pooled), and call targets torch.fx cannot name (pooled).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name

__all__ = ["compile_execution_fn", "generate_execution_code", "node_ref"]

_PLAIN = (bool, int, str, bytes, type(None))


def node_ref(arg: Any, consts: list[Any], const_index: dict[int, int]) -> str:
    """The source text of one argument; unprintable values go to the pool (by identity)."""
    if isinstance(arg, fx.Node):
        return arg.name
    if isinstance(arg, list):
        return "[" + ", ".join(node_ref(a, consts, const_index) for a in arg) + "]"
    if isinstance(arg, tuple):
        items = [node_ref(a, consts, const_index) for a in arg]
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if isinstance(arg, dict):
        return (
            "{"
            + ", ".join(
                f"{node_ref(k, consts, const_index)}: {node_ref(v, consts, const_index)}"
                for k, v in arg.items()
            )
            + "}"
        )
    if isinstance(arg, _PLAIN) or (isinstance(arg, float) and math.isfinite(arg)):
        return repr(arg)
    key = id(arg)
    slot = const_index.get(key)
    if slot is None:
        slot = const_index[key] = len(consts)
        consts.append(arg)
    return f"__vllm_consts__[{slot}]"


def _target_text(target: Any, consts: list[Any], const_index: dict[int, int]) -> str:
    try:
        name = _get_qualified_name(target)
    except Exception:  # lambdas, closures, builtins torch.fx cannot name
        name = ""
    if name.startswith(("torch.", "operator.")) or (name.isidentifier() and "." not in name):
        return name
    return node_ref(target, consts, const_index)


def _last_uses(nodes: list[fx.Node]) -> dict[int, list[str]]:
    """Position of each value's last user → names to ``del`` after it (none if returned)."""
    order = {n: i for i, n in enumerate(nodes)}
    del_after: dict[int, list[str]] = {}
    for n in nodes:
        if n.op == "output" or not n.users:
            continue
        last = max(n.users, key=order.__getitem__)
        if last.op != "output":
            del_after.setdefault(order[last], []).append(n.name)
    return del_after


def generate_execution_code_with_name(
    gm: fx.GraphModule,
    fn_name: str,
    with_submod: bool,
    consts: list[Any] | None = None,
    const_index: dict[int, int] | None = None,
) -> tuple[str, list[str], list[Any]]:
    consts = [] if consts is None else consts
    const_index = {} if const_index is None else const_index
    nodes = list(gm.graph.nodes)
    del_after = _last_uses(nodes)
    params: list[str] = []
    lines: list[str] = []
    nested: list[str] = []
    submod_names: list[str] = []
    submod_index: dict[str, int] = {}

    def ref(a: Any) -> str:
        return node_ref(a, consts, const_index)

    def call_args(n: fx.Node) -> str:
        args = ", ".join(ref(a) for a in n.args)
        kwargs = ", ".join(f"{k}={ref(v)}" for k, v in n.kwargs.items())
        return ", ".join(filter(None, [args, kwargs]))

    for i, n in enumerate(nodes):
        op = n.op
        if op == "placeholder":
            params.append(n.name)
        elif op == "call_module":
            if not with_submod:
                raise RuntimeError(f"call_module is not allowed for codegen target {n.target}.")
            target = n.target
            idx = submod_index.get(target)
            if idx is None:
                idx = submod_index[target] = len(submod_names)
                submod_names.append(target)
            child = getattr(gm, target)
            if isinstance(child, fx.GraphModule):
                callee = f"__vllm_inlined_submods__{idx}"
                code, _, _ = generate_execution_code_with_name(
                    child, callee, False, consts, const_index
                )
                nested.append(code)
            else:
                callee = f"__vllm_submods__[{idx}]"
            lines.append(f"    {n.name} = {callee}({call_args(n)})")
        elif op == "call_function":
            if n.target is operator.getitem:
                lines.append(f"    {n.name} = {ref(n.args[0])}[{ref(n.args[1])}]")
            else:
                target = _target_text(n.target, consts, const_index)
                lines.append(f"    {n.name} = {target}({call_args(n)})")
        elif op == "call_method":
            self_arg, *rest = n.args
            args = ", ".join(ref(a) for a in rest)
            kwargs = ", ".join(f"{k}={ref(v)}" for k, v in n.kwargs.items())
            all_args = ", ".join(filter(None, [args, kwargs]))
            lines.append(f"    {n.name} = {ref(self_arg)}.{n.target}({all_args})")
        elif op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            lines.append(f"    {n.name} = {ref(obj)}")
        elif op == "output":
            lines.append(f"    return {ref(n.args[0])}")
        else:
            raise RuntimeError(f"Unsupported node from codegen: {n.format_node()}")
        dels = del_after.get(i)
        if dels:
            lines.append(f"    del {', '.join(sorted(dels))}")

    kw = ", *, __vllm_submods__" if with_submod else ""
    header = f"\ndef {fn_name}({', '.join(params)}{kw}):"
    return "".join(nested) + "\n".join([header, *lines]) + "\n", submod_names, consts


def generate_execution_code(gm: fx.GraphModule) -> tuple[str, list[str], list[Any]]:
    """``(code, submod_names, consts)``; ``code`` defines ``execution_fn``."""
    code, names, consts = generate_execution_code_with_name(gm, "execution_fn", True)
    return "import torch\nimport operator\n" + code, names, consts


def compile_execution_fn(
    code: str,
    submod_callables: dict[str, Callable[..., Any]],
    submod_names: list[str],
    consts: list[Any] | None = None,
) -> Callable[..., Any]:
    """vLLM's layout: exec the code, bind the children as a list through ``functools.partial``."""
    ns: dict[str, Any] = {"__vllm_consts__": consts or [], "torch": torch, "operator": operator}
    exec(compile(code, "<reference-codegen>", "exec"), ns)
    submods = [submod_callables.get(name) for name in submod_names]
    return functools.partial(ns["execution_fn"], __vllm_submods__=submods)


def build(gm: fx.GraphModule) -> Callable[..., Any]:
    """Generate and compile, bound to ``gm``'s own opaque children."""
    code, names, consts = generate_execution_code(gm)
    callables = {}
    for name in names:
        child = gm.get_submodule(name)
        if not isinstance(child, fx.GraphModule):
            callables[name] = child
    return compile_execution_fn(code, callables, names, consts)
