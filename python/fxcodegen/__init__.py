"""fxcodegen: fast Python source generation for torch.fx split graphs.

Users import from here only; the compiled core is the private ``fxcodegen._core``.
"""

from fxcodegen._core import __version__
from fxcodegen.backend import backend
from fxcodegen.cache import CacheError, load_artifact
from fxcodegen.codegen import (
    CodegenError,
    Generated,
    build,
    compile_execution_fn,
    emit,
    generate,
    serialize,
)
from fxcodegen.example_args import concrete_args
from fxcodegen.piecewise import PiecewiseBackend, counters
from fxcodegen.program import CompiledModel, compile
from fxcodegen.ranges import OutOfRangeError, Range, ranges_from_endpoints
from fxcodegen.split import split_graph

__all__ = [
    "CacheError",
    "CodegenError",
    "CompiledModel",
    "Generated",
    "OutOfRangeError",
    "PiecewiseBackend",
    "Range",
    "__version__",
    "backend",
    "build",
    "compile",
    "compile_execution_fn",
    "concrete_args",
    "counters",
    "emit",
    "generate",
    "load_artifact",
    "ranges_from_endpoints",
    "serialize",
    "split_graph",
]
