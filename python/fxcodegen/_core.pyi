"""The compiled core (Rust). Users import from ``fxcodegen``, not from here."""

from collections.abc import Callable
from typing import Any

__version__: str

class CodegenError(RuntimeError):
    """A graph (or serialized node list) fxcodegen cannot turn into code. When one node is the
    cause, ``node``, ``op`` and ``target`` are its name, op and target as text (else None)."""

    node: str | None
    op: str | None
    target: str | None

def generate(
    gm: Any,
    *,
    resolver: Callable[[Any], str | None],
    style: str = "native",
    fn_name: str = "execution_fn",
    with_submod: bool = True,
    consts: list[Any] | None = None,
    const_index: dict[int, int] | None = None,
    header: bool = True,
) -> tuple[str, list[str], list[Any]]: ...
def serialize(gm: Any, resolver: Callable[[Any], str | None]) -> bytes: ...
def emit(
    data: bytes, style: str = "native", fn_name: str = "execution_fn"
) -> tuple[str, list[str]]: ...
def node_ref(
    arg: Any,
    consts: list[Any],
    const_index: dict[int, int],
    resolver: Callable[[Any], str | None],
    style: str = "vllm",
) -> str: ...
