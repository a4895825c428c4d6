"""fxcodegen: fast Python source generation for torch.fx split graphs.

Users import from here only; the compiled core is the private ``fxcodegen._core``.
"""

from fxcodegen._core import __version__
from fxcodegen.codegen import (
    CodegenError,
    Generated,
    build,
    compile_execution_fn,
    emit,
    generate,
    serialize,
)

__all__ = [
    "CodegenError",
    "Generated",
    "__version__",
    "build",
    "compile_execution_fn",
    "emit",
    "generate",
    "serialize",
]
