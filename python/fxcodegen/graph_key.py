"""The cache key of one split graph, computed from its plan before anything is compiled:
what shapes the compiled output (:func:`graph_factors`), and the global Inductor config's
hash (:func:`global_config_hash`, also part of :func:`fxcodegen.compile`'s program key)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import torch

from fxcodegen.cache import make_factors
from fxcodegen.codegen import serialize
from fxcodegen.fingerprint import KEY_VERSION, config_repr, split_graph_key
from fxcodegen.plan import PiecePlan
from fxcodegen.settings import Settings

__all__ = ["global_config_hash", "graph_factors"]

_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


def _portable_config(module: Any) -> list[tuple[str, Any]]:
    """A config module's public values, callables and classes by qualified name (what
    ``save_config_portable`` keeps, without its serializers, which import the whole of
    Inductor's lowering: a warm start that compiles nothing should not pay for that)."""
    ignored = ("_", *getattr(module, "_cache_config_ignore_prefix", []))
    out = []
    for name, value in module.get_config_copy().items():
        if name.startswith(ignored):
            continue
        if callable(value):
            value = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        out.append((name, value))
    return sorted(out, key=lambda kv: kv[0])


def global_config_hash() -> str:
    """A hash of the global Inductor and functorch configs (what Inductor's own cache keys
    on), so that changing e.g. ``torch._inductor.config.max_autotune`` is a miss."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = [_portable_config(inductor_config), _portable_config(functorch_config)]
    return "sha256:" + hashlib.sha256(_ADDRESS_RE.sub("", repr(parts)).encode()).hexdigest()


def _device_factors(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """What the compiled code depends on about the machine: the CPU's vector ISA (Inductor's
    C++ kernels are built for it) and, for CUDA inputs, the CUDA version and capabilities."""
    out: dict[str, Any] = {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    devices = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            v = node.meta.get("example_value", node.meta.get("val"))
            if isinstance(v, torch.Tensor):
                devices.add(v.device)
    cuda = sorted((d for d in devices if d.type == "cuda"), key=str)
    if cuda:
        out["cuda"] = str(torch.version.cuda)
        out["cuda_capability"] = {str(d): list(torch.cuda.get_device_capability(d)) for d in cuda}
    return out


def graph_factors(
    s: Settings, split_gm: torch.fx.GraphModule, plans: Mapping[str, PiecePlan]
) -> tuple[dict[str, Any], bool]:
    """``(factors, stable)`` of a split graph whose pieces are planned, not compiled.

    Beyond :func:`fxcodegen.cache.make_factors` (serialized node list, splitting ops,
    ranges, sizes, compiler and options, versions), ``extra`` holds: ``pieces`` (each
    compiled piece's :func:`structural_key`: placeholder shapes/strides/dtypes/devices,
    ops, literals and the content of tensors the piece holds, which Inductor bakes in),
    ``values`` (:func:`split_graph_key`: the same over the whole split graph, i.e. every
    value the stitching code's pool bakes in, tensors by content), the global Inductor
    config's hash, ``entry_config`` (with a callable ``inductor_config``: the patches it
    gives each piece's entries, by label) and the device factors. Parameters passed as
    graph inputs are not baked in, so their values are not in the key. ``stable`` is False when a part is
    keyed by object identity (then the graph is not cached).
    """
    piece_keys = {name: p.struct_key for name, p in plans.items()}
    stable = all(p.stable for p in plans.values())
    entry_configs = (
        {
            name: {ep.entry.label: config_repr(ep.config) for ep in p.entries}
            for name, p in plans.items()
        }
        if callable(s.inductor_config)
        else {}
    )
    values, ok = split_graph_key(split_gm, piece_keys)
    stable = stable and ok
    factors = make_factors(
        graph=serialize(split_gm),
        splitting_ops=s.splitting_ops,
        compile_ranges=s.compile_ranges,
        compile_sizes=s.compile_sizes,
        compiler=s.compiler,
        compiler_options={
            "config_patches": "per entry" if callable(s.inductor_config) else s.inductor_config
        },
        extra={
            "key_version": KEY_VERSION,
            "pieces": piece_keys,
            "values": values,
            "inductor_config": global_config_hash(),
            **({"entry_config": entry_configs} if entry_configs else {}),
            "range_dim": list(s.range_dim) if s.range_dim else None,
            "devices": _device_factors(split_gm),
        },
    )
    return factors, stable
