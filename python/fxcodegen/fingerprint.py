"""Content keys: what identifies a piece, a split graph and a compiled entry.

:func:`structural_key` describes a GraphModule canonically (node names and parameter
identities dropped, everything that changes compiled code kept) and hashes it; equal keys mean
the pieces compile to the same thing, so identical pieces compile once and the artifact cache
can key on them. :func:`entry_key` adds the entry, the compiler, its config and the torch
version.
"""

from __future__ import annotations

import enum
import hashlib
import json
import pickle
import sys
import types
from collections.abc import Mapping
from typing import Any

import sympy
import torch

__all__ = [
    "KEY_VERSION",
    "compile_key",
    "config_repr",
    "entry_key",
    "split_graph_key",
    "structural_key",
    "structural_key_stable",
]

KEY_VERSION = 3
"""Bumped whenever the key layout changes, so old cache entries are never matched."""


class _Keyer:
    """Builds a canonical, JSON-able description of a GraphModule.

    Node names and placeholder targets are dropped (nodes are referred to by position);
    parameter *inputs* are described by metadata only, so layers differing only in their
    weights get equal keys. Everything that changes compiled code is kept: ops and call
    targets, literal arguments, placeholder shapes/strides/offsets/dtypes/devices, and the
    values of tensors the graph holds itself (``get_attr``), hashed by content.
    """

    def __init__(self, known_modules: Mapping[int, str] | None = None) -> None:
        self.symbols: dict[sympy.Symbol, str] = {}
        self.known_modules = dict(known_modules or {})
        """``id(module) -> key`` of children already keyed (described by that key)."""
        self.unstable = False
        """Set when part of the description is an object identity (a closure, a fake
        tensor's data, an unnamed object): equal within this process only."""

    def identity(self, obj: Any) -> int:
        self.unstable = True
        return id(obj)

    # symbolic values ------------------------------------------------------------------
    def expr(self, e: sympy.Basic, shape_env: Any = None) -> str:
        for s in sorted(e.free_symbols, key=str):
            if s not in self.symbols:
                rng = None
                if shape_env is not None:
                    rng = shape_env.var_to_range.get(s)
                self.symbols[s] = f"s{len(self.symbols)}" + (f"[{rng}]" if rng is not None else "")
        return str(e.xreplace({s: sympy.Symbol(n) for s, n in self.symbols.items()}))

    def sym(self, v: Any) -> Any:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            e = v.node.expr
            if not e.free_symbols:  # a specialised size: the same as a plain number
                kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(v)]
                return kind(e)
            return [type(v).__name__, self.expr(e, getattr(v.node, "shape_env", None))]
        return v

    # tensors -----------------------------------------------------------------------
    def tensor_meta(self, t: torch.Tensor) -> list[Any]:
        return [
            "tensor",
            type(t).__name__ if not isinstance(t, torch._subclasses.FakeTensor) else "Tensor",
            str(t.dtype),
            str(t.device),
            str(t.layout),
            [self.sym(d) for d in t.shape],
            [self.sym(d) for d in t.stride()] if t.layout == torch.strided else None,
            self.sym(t.storage_offset()) if t.layout == torch.strided else None,
            bool(t.requires_grad),
        ]

    def tensor_value(self, t: torch.Tensor) -> list[Any]:
        meta = self.tensor_meta(t)
        if isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta":
            return [*meta, "no-data", self.identity(t)]  # cannot hash data: never merge
        data = t.detach().cpu().contiguous()
        digest = hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        return [*meta, digest]

    # call targets ------------------------------------------------------------------
    def target(self, t: Any) -> Any:
        if isinstance(t, str):
            return t
        if isinstance(t, torch._ops.OpOverload):
            return ["op", str(t.namespace), t._opname, t._overloadname]
        if isinstance(t, torch._ops.OpOverloadPacket):
            return ["packet", t._qualified_op_name]
        if isinstance(t, torch._ops.HigherOrderOperator):
            return ["hop", t.name()]
        module = getattr(t, "__module__", None)
        qual = getattr(t, "__qualname__", None) or getattr(t, "__name__", None)
        if (
            isinstance(t, types.FunctionType)
            and (t.__closure__ or "<lambda>" in (qual or "") or "<locals>" in (qual or ""))
            and not _importable_as(t, module, qual)
        ):
            # Closures and local functions may differ under one name: key by identity.
            return ["fn-id", module, qual, self.identity(t)]
        if module is not None and qual is not None:
            return ["fn", module, qual]
        return ["obj", type(t).__module__, type(t).__qualname__, self.identity(t)]

    # arguments ---------------------------------------------------------------------
    def arg(self, a: Any, index: dict[torch.fx.Node, int]) -> Any:
        if isinstance(a, torch.fx.Node):
            return ["node", index[a]]
        if a is None or isinstance(a, (bool, str)):
            return a
        if isinstance(a, (int, float)):
            return [type(a).__name__, repr(a)]
        if isinstance(a, (tuple, list)):
            return [type(a).__name__, [self.arg(x, index) for x in a]]
        if isinstance(a, dict):
            return ["dict", [[self.arg(k, index), self.arg(v, index)] for k, v in a.items()]]
        if isinstance(a, slice):
            return ["slice", [self.arg(x, index) for x in (a.start, a.stop, a.step)]]
        if a is Ellipsis:
            return ["..."]
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.sym(a)
        if isinstance(a, torch.Tensor):
            return self.tensor_value(a)
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return [type(a).__name__, str(a)]
        if isinstance(a, enum.Enum):
            return ["enum", type(a).__module__, type(a).__qualname__, a.name]
        if isinstance(a, (bytes, complex)):
            return [type(a).__name__, repr(a)]
        if callable(a):
            return self.target(a)
        return ["obj", type(a).__module__, type(a).__qualname__, self.content(a)]

    def content(self, a: Any) -> Any:
        # A repr need not show an object's state: hash its pickle (the cache pickles the
        # constant pool anyway); an object that does not pickle is keyed by identity.
        try:
            return hashlib.sha256(pickle.dumps(a, protocol=4)).hexdigest()
        except Exception:  # any pickling failure
            return ["id", self.identity(a)]

    def example(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return self.tensor_meta(v)
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.sym(v)
        return self.arg(v, {})

    # modules -----------------------------------------------------------------------
    def module(self, m: Any) -> Any:
        known = self.known_modules.get(id(m))
        if known is not None:
            return ["keyed", known]
        if isinstance(m, torch.fx.GraphModule):
            return ["graph", self.graph(m)]
        if isinstance(m, torch.nn.Module):
            state = [[k, self.tensor_value(v)] for k, v in m.state_dict(keep_vars=True).items()]
            return ["module", type(m).__module__, type(m).__qualname__, repr(m), state]
        if isinstance(m, torch.Tensor):
            return self.tensor_value(m)
        return self.arg(m, {})

    def graph(self, gm: torch.fx.GraphModule) -> list[Any]:
        index: dict[torch.fx.Node, int] = {}
        out: list[Any] = []
        for i, node in enumerate(gm.graph.nodes):
            index[node] = i
            if node.op == "placeholder":
                value = node.meta.get("example_value", node.meta.get("val"))
                out.append(["placeholder", self.example(value), self.arg(node.args, index)])
            elif node.op == "get_attr":
                out.append(["get_attr", self.module(_fetch_attr(gm, str(node.target)))])
            elif node.op == "call_module":
                child = gm.get_submodule(str(node.target))
                out.append(
                    [
                        "call_module",
                        self.module(child),
                        self.arg(node.args, index),
                        self.arg(node.kwargs, index),
                    ]
                )
            else:
                out.append(
                    [
                        node.op,
                        self.target(node.target),
                        self.arg(node.args, index),
                        self.arg(node.kwargs, index),
                    ]
                )
        return out


def _importable_as(fn: Any, module: str | None, qual: str | None) -> bool:
    """Whether ``module.qual`` names ``fn`` itself (a closure a module publishes, such as
    ``torch._sym_sqrt``, is then as stable as any function)."""
    mod = sys.modules.get(module or "")
    if mod is None or not qual:
        return False
    obj: Any = mod
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def structural_key(gm: torch.fx.GraphModule) -> str:
    """A hex SHA-256 of ``gm``'s structure: equal for pieces that compile identically.

    Ignores node names and the identity of parameter inputs; includes ops and targets,
    literal arguments (constants), placeholder shapes, strides, storage offsets, dtypes,
    devices and requires_grad, symbolic expressions (symbols renamed canonically, value
    ranges kept), and the content of tensors held by the graph (``get_attr``). Stable across
    processes for graphs that hold no closures or local functions.
    """
    return structural_key_stable(gm)[0]


def structural_key_stable(gm: torch.fx.GraphModule) -> tuple[str, bool]:
    """``(structural_key(gm), stable)``: ``stable`` is False when the key holds an object
    identity (a closure or local function as call target, a fake tensor held as a
    constant, an object that does not pickle), so it is valid in this process only."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"structural_key expects a torch.fx.GraphModule, got {type(gm).__name__}")
    keyer = _Keyer()
    desc = keyer.graph(gm)
    text = json.dumps([KEY_VERSION, desc], separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest(), not keyer.unstable


def split_graph_key(
    split_gm: torch.fx.GraphModule, piece_keys: Mapping[str, str] | None = None
) -> tuple[str, bool]:
    """``(key, stable)`` of a whole split graph: its nodes as :func:`structural_key` sees
    them, with the children named in ``piece_keys`` described by those keys (not walked
    again) and every other child (inlined splitting pieces) walked.

    This covers every value the generated stitching code and the pieces bake in: call
    targets, literals, and the content of tensors held by any graph (``get_attr``). Values
    that are neither are hashed by their pickle. ``stable`` is False when part of the
    description is an object identity (closures, local functions, fake tensors held as
    constants, objects that do not pickle): such a key is valid in this process only.
    """
    known: dict[int, str] = {}
    for name, key in (piece_keys or {}).items():
        known[id(split_gm.get_submodule(name))] = key
    keyer = _Keyer(known)
    desc = keyer.graph(split_gm)
    text = json.dumps([KEY_VERSION, "split", desc], separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest(), not keyer.unstable


def _config_value(value: Any) -> str:
    # A CustomGraphPass (anything with uuid()) is identified by its uuid, as Inductor's own
    # cache does; other values by repr.
    uuid = getattr(value, "uuid", None)
    if callable(uuid):
        return f"uuid:{uuid()!r}"
    return repr(value)


def config_repr(patches: Mapping[str, Any] | None) -> list[list[str]]:
    """A JSON-able description of Inductor config patches (what the keys cover)."""
    return sorted([str(k), _config_value(v)] for k, v in (patches or {}).items())


def entry_key(
    struct_key: str,
    entry: Any,
    compiler: str,
    inductor_config: Mapping[str, Any] | None = None,
) -> str:
    """The content key of one compiled entry (a :class:`fxcodegen.piecewise.Entry`): piece
    structure, entry, compiler, the config patches the entry is compiled with and the torch
    version (artifacts only load into the same torch build)."""
    payload = json.dumps(
        [
            KEY_VERSION,
            struct_key,
            [entry.kind, entry.start, entry.end],
            compiler,
            config_repr(inductor_config),
            torch.__version__,
        ],
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def compile_key(
    struct_key: str,
    facts: Any,
    compiler: str,
    inductor_config: Mapping[str, Any] | None = None,
) -> str:
    """The sharing key of one compile: what reaches the compiler. ``facts`` describes what
    it is told about the dispatch size (:meth:`fxcodegen.entries.Bounds.facts`, ``None``
    for a static entry). Equal keys compile to the same thing and share one result."""
    payload = json.dumps(
        [
            KEY_VERSION,
            "compile",
            struct_key,
            facts,
            compiler,
            config_repr(inductor_config),
            torch.__version__,
        ],
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()
