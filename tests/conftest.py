"""Shared helpers for the codegen tests (kept small: other test files live here too)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

SURFACES = ("native", "vllm")


def fresh_python(
    code: str, env: dict[str, str], *args: str, check: bool = False
) -> subprocess.CompletedProcess:
    """``python -c code *args`` in a fresh process, with ``env`` over this one's environment,
    its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=check,
    )


def host_details_in(text: str, *paths: str) -> list[str]:
    """The details of this host that ``text`` gives away: ``paths``, the home and working
    directories and the host name as substrings; this process's id as a whole number, not
    next to a hex digit (a hex digest may contain its digits by chance)."""
    found = [
        p for p in (*paths, str(Path.home()), str(Path.cwd()), socket.gethostname()) if p in text
    ]
    pid = str(os.getpid())
    return found + [pid] * bool(re.search(rf"(?<![0-9a-f]){pid}(?![0-9a-f])", text))


def run_in_threads(n: int, work: Callable[[int], None]) -> list[BaseException]:
    """Runs ``work(k)`` for ``k`` in ``range(n)``, each on its own thread, all released together;
    returns what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run(k: int) -> None:
        try:
            barrier.wait()
            work(k)
        except BaseException as e:  # returned to the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def raw_gm(
    graph: fx.Graph, root: torch.nn.Module | None = None, fx_codegen: bool = True
) -> fx.GraphModule:
    """A GraphModule around ``graph``. When fx's own codegen rejects the graph (fxcodegen must
    handle some such graphs, e.g. keyword-named kwargs), or ``fx_codegen`` is false (it takes
    half a minute on a call of 65k keyword arguments), the module is built without it: its
    ``forward`` is then unusable, but its graph and children are what fxcodegen reads."""
    root = root if root is not None else torch.nn.Module()
    if fx_codegen:
        try:
            return fx.GraphModule(root, graph)
        except Exception:  # any failure of fx's codegen
            pass
    gm = fx.GraphModule(root, fx.Graph())
    for node in graph.nodes:
        target = node.target
        if node.op in ("call_module", "get_attr") and "." not in target and hasattr(root, target):
            setattr(gm, node.target, getattr(root, node.target))
    gm._graph = graph
    graph.owning_module = gm
    return gm


def opaque_children(gm: fx.GraphModule, names: list[str]) -> dict[str, Any]:
    out = {}
    for name in names:
        child = gm.get_submodule(name)
        if not isinstance(child, fx.GraphModule):
            out[name] = child
    return out


def compile_surface(gm: fx.GraphModule, surface: str) -> Callable[..., Any]:
    """Generate and compile ``gm`` through the native API or the vLLM compat surface."""
    if surface == "native":
        import fxcodegen

        gen = fxcodegen.generate(gm)
        return fxcodegen.compile_execution_fn(
            gen.code, opaque_children(gm, gen.submod_names), gen.submod_names, gen.consts
        )
    from fxcodegen.compat import vllm

    code, names, consts = vllm.generate_execution_code(gm)
    return vllm.compile_execution_fn(code, opaque_children(gm, names), names, consts)


def generate_surface(gm: fx.GraphModule, surface: str) -> tuple[str, list[str], list[Any]]:
    if surface == "native":
        import fxcodegen

        return tuple(fxcodegen.generate(gm))  # type: ignore[return-value]
    from fxcodegen.compat import vllm

    return vllm.generate_execution_code(gm)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and fxcodegen's counters reset around a test that compiles."""
    from fxcodegen import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()
