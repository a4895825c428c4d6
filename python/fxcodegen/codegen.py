"""Generate, compile and build the execution function of a torch.fx split graph.

The node walk and the source emission happen in the Rust core (``fxcodegen._core``); this
module owns what is Python by nature: naming call targets, binding the generated code to
its submodules and constant pool, and registering the source with ``linecache``.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import linecache
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from fxcodegen import _core
from fxcodegen._core import CodegenError

if TYPE_CHECKING:
    from fxcodegen.cache import Artifact

__all__ = [
    "CodegenError",
    "Generated",
    "build",
    "compile_execution_fn",
    "emit",
    "generate",
    "serialize",
]

# Layout of the native surface's generated code (the vLLM surface uses its own names).
FN_NAME = "execution_fn"
SUBMOD_PREFIX = "__fx_s"
CONST_PREFIX = "__fx_c"


class Generated(NamedTuple):
    """What :func:`generate` returns."""

    code: str
    """Python source defining ``execution_fn``."""
    submod_names: list[str]
    """``submod_names[i]`` is the child called as submodule ``i``."""
    consts: list[Any]
    """``consts[i]`` is constant-pool slot ``i``."""


def _candidate(obj: Any) -> tuple[Any, str, tuple[str, ...]] | None:
    """Where a name for ``obj`` would point where the code runs, as (root object, the root's
    name with its dot, attribute path): ``torch.ops`` overloads and packets, ``operator``
    functions and builtins, the only kinds the core writes by name."""
    if isinstance(obj, torch._ops.OpOverload):
        return torch.ops, "torch.ops.", (obj.namespace, obj._opname, obj._overloadname)
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return torch.ops, "torch.ops.", tuple(obj._qualified_op_name.split("::"))
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str):
        return None
    module = getattr(obj, "__module__", None)
    if module in ("_operator", "operator"):
        return operator, "operator.", (name,)
    if module == "builtins":
        return builtins, "", (name,)
    return None


def resolve_target(obj: Any) -> str | None:
    """The text naming ``obj`` in the generated namespace, or None to pool it.

    A name is used only when it resolves to the very same object where the generated code
    runs (``torch``, ``operator`` and builtins are bound there); everything else goes to the
    constant pool. The core further keeps names to what untrusted serialized input may name
    (``torch.ops.*``, pure ``operator`` functions, pure builtins) and pools the rest, so
    ``emit(serialize(gm))`` always accepts what ``generate(gm)`` accepts. Called by the Rust
    core once per distinct call target, so on small graphs its cost shows: the path is
    walked with plain ``getattr`` calls, no text is split or joined until it is known good.
    The core keeps the names this returns across calls and asks again only when a kept name
    no longer leads to its target (or for targets it pooled).
    """
    found = _candidate(obj)
    if found is None:
        return None
    at, prefix, path = found
    try:
        for part in path:
            at = getattr(at, part)
    except (LookupError, AttributeError, RuntimeError):
        return None
    return prefix + ".".join(path) if at is obj else None


def generate(split_gm: torch.fx.GraphModule) -> Generated:
    """Generate the execution source of ``split_gm`` (never mutates it)."""
    code, names, consts = _core.generate(
        split_gm, resolver=resolve_target, style="native", fn_name=FN_NAME, with_submod=True
    )
    return Generated(code, names, consts)


def serialize(split_gm: torch.fx.GraphModule) -> bytes:
    """The versioned serialized node list of ``split_gm`` (see ``docs/serial-format.md``)."""
    return _core.serialize(split_gm, resolve_target)


def emit(data: bytes) -> tuple[str, list[str]]:
    """Emit source from a serialized node list. ``data`` is untrusted: bad input raises
    :class:`CodegenError`, never anything else."""
    return _core.emit(data, "native", FN_NAME)


_counter = itertools.count()


def exec_source(code: str, namespace: dict[str, Any], tag: str = "fxcodegen") -> Any:
    """Compile and exec ``code`` under a synthetic file name registered in ``linecache``;
    returns the module code object."""
    filename = f"<{tag}-{next(_counter)}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    module = compile(code, filename, "exec")
    exec(module, namespace)
    return module


def unwrap_piece(fn: Any) -> Any:
    # Calling .forward skips nn.Module.__call__ (hooks are not used on pieces).
    if isinstance(fn, torch.nn.Module) and not (fn._forward_hooks or fn._forward_pre_hooks):
        return fn.forward
    return fn


def bind_namespace(
    submod_callables: dict[str, Callable[..., Any]] | None,
    submod_names: list[str],
    consts: list[Any] | None,
) -> dict[str, Any]:
    ns: dict[str, Any] = {"torch": torch, "operator": operator}
    if consts is not None:
        for i, c in enumerate(consts):
            ns[f"{CONST_PREFIX}{i}"] = c
    callables = submod_callables or {}
    for i, name in enumerate(submod_names):
        if name in callables:
            ns[f"{SUBMOD_PREFIX}{i}"] = unwrap_piece(callables[name])
    return ns


def _referenced_globals(code_obj: Any) -> set[str]:
    names = set(code_obj.co_names)
    for c in code_obj.co_consts:
        if hasattr(c, "co_names"):
            names |= _referenced_globals(c)
    return names


def check_bindings(code_obj: Any, submod_names: list[str], ns: dict[str, Any]) -> None:
    """Raise :class:`CodegenError` if a submodule or pool-slot global read anywhere in the
    module code ``code_obj`` (inlined children included) is not bound in ``ns``."""
    needed = _referenced_globals(code_obj)
    for i, name in enumerate(submod_names):
        g = f"{SUBMOD_PREFIX}{i}"
        if g in needed and g not in ns:
            raise CodegenError(f"no callable bound for submodule {i} ({name!r})")
    missing = sorted(n for n in needed if n.startswith(CONST_PREFIX) and n not in ns)
    if missing:
        raise CodegenError(f"the code reads constant-pool slots that are not bound: {missing}")


def compile_execution_fn(
    code: str,
    submod_callables: dict[str, Callable[..., Any]] | None,
    submod_names: list[str],
    consts: list[Any] | None = None,
) -> Callable[..., Any]:
    """Bind generated ``code`` to its opaque submodules and constant pool.

    ``submod_callables`` maps child names to callables; only non-inlined children need one.
    ``consts=None`` loads code generated without a pool.
    """
    ns = bind_namespace(submod_callables, submod_names, consts)
    module = exec_source(code, ns)
    check_bindings(module, submod_names, ns)
    return ns[FN_NAME]


def bind_stored(
    art: Artifact, submod_callables: Mapping[str, Callable[..., Any]] | None
) -> Callable[..., Any]:
    """Bind a stored graph's code object to ``submod_callables`` and its pool; no
    ``compile()`` of source when the code object was unmarshaled."""
    filename = art.filename or f"<fxcodegen-{hashlib.sha256(art.code.encode()).hexdigest()[:16]}>"
    code_obj = art.code_object
    if code_obj is None:
        code_obj = compile(art.code, filename, "exec")
    ns = bind_namespace(dict(submod_callables or {}), art.submod_names, art.consts)
    linecache.cache[filename] = (len(art.code), None, art.code.splitlines(keepends=True), filename)
    exec(code_obj, ns)
    check_bindings(code_obj, art.submod_names, ns)
    return ns[art.fn_name]


def build(split_gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """Generate and compile the execution function, bound to ``split_gm``'s own children."""
    gen = generate(split_gm)
    callables = {}
    for name in gen.submod_names:
        child = split_gm.get_submodule(name)
        if not isinstance(child, torch.fx.GraphModule):
            callables[name] = child
    return compile_execution_fn(gen.code, callables, gen.submod_names, gen.consts)
