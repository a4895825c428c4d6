"""A drop-in for ``vllm.compilation.codegen``: switch one import.

Generated code uses vLLM's names: ``execution_fn(..., *, __vllm_submods__)``,
``__vllm_submods__[i](...)``, ``__vllm_consts__[i]`` and ``__vllm_inlined_submods__{i}`` for
inlined plain GraphModule children. Semantics are fxcodegen's (literal rules, interning,
naming, liveness), produced by the same Rust core as the native API.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from fxcodegen import _core
from fxcodegen.codegen import exec_source, resolve_target, unwrap_piece

__all__ = [
    "_node_ref",
    "compile_execution_fn",
    "generate_execution_code",
    "generate_execution_code_with_name",
]


def generate_execution_code_with_name(
    split_gm: torch.fx.GraphModule,
    fn_name: str,
    with_submod: bool,
    consts: list[Any] | None = None,
    const_index: dict[int, int] | None = None,
) -> tuple[str, list[str], list[Any]]:
    """Source defining ``fn_name`` (and the inlined children before it), the submodule names and
    the pool. ``consts``/``const_index`` continue an existing pool (``id(obj) -> slot``) and are
    extended in place."""
    if consts is None:
        consts = []
    if const_index is None:
        const_index = {}
    code, names, consts = _core.generate(
        split_gm,
        resolver=resolve_target,
        style="vllm",
        fn_name=fn_name,
        with_submod=with_submod,
        consts=consts,
        const_index=const_index,
        header=False,
    )
    return code, names, consts


def generate_execution_code(
    split_gm: torch.fx.GraphModule,
) -> tuple[str, list[str], list[Any]]:
    """``(code, submod_names, consts)`` for ``split_gm``'s stitching graph."""
    code, names, consts = _core.generate(
        split_gm, resolver=resolve_target, style="vllm", fn_name="execution_fn", with_submod=True
    )
    return code, names, consts


def compile_execution_fn(
    code: str,
    submod_callables: dict[str, Callable[..., Any]],
    submod_names: list[str],
    consts: list[Any] | None = None,
) -> Callable[..., Any]:
    """Exec ``code`` and bind ``__vllm_submods__`` (by ``submod_names`` order; inlined children
    need no callable and get ``None``) and, when given, ``__vllm_consts__``."""
    namespace: dict[str, Any] = {"torch": torch}
    if consts is not None:
        namespace["__vllm_consts__"] = consts
    exec_source(code, namespace, tag="fxcodegen-vllm")
    fn = namespace["execution_fn"]
    submods = [
        unwrap_piece(submod_callables[name]) if name in submod_callables else None
        for name in submod_names
    ]
    return partial(fn, __vllm_submods__=submods)


def _node_ref(arg: Any, consts: list[Any], const_index: dict[int, int]) -> str:
    """``arg`` as generated code writes it: nodes by name, literals inline, everything else as
    ``__vllm_consts__[i]`` (appended to ``consts`` and recorded in ``const_index``)."""
    return _core.node_ref(arg, consts, const_index, resolve_target, "vllm")
