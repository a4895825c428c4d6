"""A source that one thread writes, and that is expected to take 43-85 KiB, goes straight into
the str ``generate`` returns: the emitter writes into the data of a str made larger than the source is expected to
be, which is then cut to the source's length. A source that outgrows it, and every other
source, is copied into a str of its own. Either way the code must equal, byte for byte, what
``emit(serialize(gm))`` writes, and the str must be an ordinary, exactly sized one.
"""

from __future__ import annotations

import operator
import sys

import fxcodegen
import pytest
import torch
from conftest import run_in_threads
from fxcodegen.bench import workloads
from torch import fx


def whole_list_code(gm: fx.GraphModule) -> str:
    return fxcodegen.emit(fxcodegen.serialize(gm))[0]


def bytes_gm(n: int, size: int) -> fx.GraphModule:
    """``n`` adds of a ``size``-byte literal each: each statement's repr (four characters a
    byte) is several times what the emitter expects a node to take."""
    g = fx.Graph()
    prev = x = g.placeholder("x")
    for k in range(n):
        prev = g.call_function(operator.add, (prev, bytes([k % 256]) * size))
    g.output((prev, x))
    return fx.GraphModule(torch.nn.Module(), g)


def assert_exact_str(code: str) -> None:
    """An ASCII str of its own length: no spare bytes left from a larger one."""
    assert code.isascii()
    assert sys.getsizeof(code) == sys.getsizeof("a" * len(code))
    assert hash(code) == hash(code.encode().decode())  # hashed over its length, like a copy
    compile(code, "<generated>", "exec")


GRAPHS = {
    "stitch-1k": lambda: workloads.stitch(1_000).gm,
    "inline-1k": lambda: workloads.inline(1_000).gm,
    "outgrows-its-str": lambda: bytes_gm(800, 64),
    "small": lambda: workloads.inline(100).gm,
    "large": lambda: workloads.inline(10_000).gm,
    "two-threads": lambda: workloads.inline(40_000).gm,
}


@pytest.mark.parametrize("graph", GRAPHS)
def test_the_code_is_the_same_in_an_exactly_sized_str(graph: str) -> None:
    gm = GRAPHS[graph]()
    want = whole_list_code(gm)
    for _ in range(2):  # a first call and one reusing what it kept
        code = fxcodegen.generate(gm).code
        assert code == want
        assert_exact_str(code)


def test_sources_written_into_strs_from_several_threads_are_the_same() -> None:
    # Each call writes into a str of its own, noted by the one allocator meanwhile.
    gms = [workloads.inline(600 + 40 * k).gm for k in range(12)]
    want = [whole_list_code(gm) for gm in gms]

    def work(k: int) -> None:
        for _ in range(3):
            code = fxcodegen.generate(gms[k]).code
            assert code == want[k], k
            assert_exact_str(code)

    assert run_in_threads(len(gms), work) == []
