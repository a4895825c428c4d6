"""The key of a stored program, computed from the model and the call without tracing.

A warm start must find its stored program before Dynamo runs, so the key cannot come from
the traced graph. It covers what decides the trace:

- the model's code: the source files defining each module class in the tree (torch's own
  classes are covered by the torch version) and the versions of the packages they live in;
- the module tree: each submodule's name, class, ``training`` flag and plain attributes
  (ints, floats, strings, bools, ``None`` and tuples of them), and a Hugging Face
  ``config`` in full;
- the parameters and buffers: name, shape, dtype, device, ``requires_grad``. Their values
  are not in the key: weights are inputs of the traced program;
- the call: each argument's structure, tensors by dtype, rank, device and
  ``requires_grad``, Python ints and floats by type (sizes and numbers are dynamic),
  bools, strings and ``None`` by value; and the grad mode;
- fxcodegen's options, the global Inductor config, the CPU's vector ISA, and the torch,
  Python and fxcodegen builds (:func:`fxcodegen.cache.make_factors`).

Code the forward calls in other files is not hashed here; the stored program records
the source of every function Dynamo traced and a load checks it (``docs/cache.md``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fxcodegen.cache import make_factors
from fxcodegen.fingerprint import config_repr

__all__ = ["PROGRAM_KEY_VERSION", "call_signature", "model_factors", "program_factors"]

PROGRAM_KEY_VERSION = 1

_PLAIN = (bool, int, float, str, type(None))


@functools.lru_cache(maxsize=256)
def _file_digest(path: str) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, tuple) and all(_plain(v) for v in value)


def _code_factors(model: torch.nn.Module) -> dict[str, Any]:
    """The source files of the model's own classes by digest, and the versions of the
    packages they come from."""
    files: dict[str, str] = {}
    packages: dict[str, str] = {}
    for cls in {c for m in model.modules() for c in type(m).__mro__}:
        module = cls.__module__ or ""
        top = module.partition(".")[0]
        if top in ("torch", "builtins"):
            continue
        version = getattr(sys.modules.get(top), "__version__", None)
        if isinstance(version, str):
            packages[top] = version
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            path = None
        # A module name, not a path: the same code installed elsewhere has the same key.
        files[module] = _file_digest(path) if path else "no source"
    return {"files": files, "packages": packages}


def _module_attrs(module: torch.nn.Module) -> dict[str, Any]:
    attrs: dict[str, Any] = {"training": module.training}
    for name, value in vars(module).items():
        if not name.startswith("_") and name != "training" and _plain(value):
            attrs[name] = value
    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        attrs["config"] = json.loads(json.dumps(to_dict(), sort_keys=True, default=repr))
    return attrs


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def model_factors(model: torch.nn.Module) -> dict[str, Any]:
    """What the key holds of the model (no tracing, no weights)."""
    tree = []
    root_config: Any = None
    for name, module in model.named_modules():
        attrs = _module_attrs(module)
        if name == "" and "config" in attrs:
            root_config = attrs.pop("config")
        elif "config" in attrs:
            attrs["config"] = _digest(attrs["config"])
        tree.append([name, f"{type(module).__module__}.{type(module).__qualname__}", attrs])
    tensors = [
        [name, list(t.shape), str(t.dtype), str(t.device), bool(t.requires_grad)]
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    ]
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        # The config in full, so a miss names the field that changed.
        "config": root_config,
        "tree": _digest(tree),
        "tensors": _digest(tensors),
        "code": _code_factors(model),
    }


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {
            "tensor": str(value.dtype),
            "dim": value.dim(),
            "device": value.device.type,
            "grad": bool(value.requires_grad),
        }
    if isinstance(value, (bool, str, type(None))):
        return value
    if isinstance(value, (int, float)):
        return type(value).__name__
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_describe(v) for v in value]}
    if isinstance(value, Mapping):
        return {"dict": {str(k): _describe(v) for k, v in value.items()}}
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}"}


def call_signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The call's structure as canonical JSON (what one stored program is traced for)."""
    doc = {
        "args": [_describe(a) for a in args],
        "kwargs": {k: _describe(v) for k, v in sorted(kwargs.items())},
        "grad": torch.is_grad_enabled(),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _options(backend: Any) -> dict[str, Any]:
    config = backend.inductor_config
    if callable(config):
        fn = getattr(config, "__code__", None)
        config = {
            "callable": f"{getattr(config, '__module__', '?')}."
            f"{getattr(config, '__qualname__', type(config).__qualname__)}",
            "code": None if fn is None else hashlib.sha256(fn.co_code).hexdigest(),
        }
    else:
        config = config_repr(config)
    return {
        "splitting_ops": list(backend.splitting_ops),
        "compile_ranges": backend.compile_ranges,
        "compile_sizes": backend.compile_sizes,
        "compiler": backend.compiler,
        "inductor_config": config,
        "range_dim": list(backend.range_dim) if backend.range_dim else None,
    }


def program_factors(
    model_part: Mapping[str, Any], signature: str, backend: Any, global_config: str
) -> dict[str, Any]:
    """The factors of one stored program: ``model_part`` from :func:`model_factors`, the
    call's :func:`call_signature`, the backend's options and the global Inductor config's
    hash."""
    options = _options(backend)
    return make_factors(
        # A program has no graph yet: its trace is what the key stands in for.
        graph=b"",
        splitting_ops=options.pop("splitting_ops"),
        compile_ranges=options.pop("compile_ranges"),
        compile_sizes=options.pop("compile_sizes"),
        compiler=options.pop("compiler"),
        compiler_options=options,
        extra={
            "program_key_version": PROGRAM_KEY_VERSION,
            "model": dict(model_part),
            "call": json.loads(signature),
            "inductor_config": global_config,
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        },
    )
