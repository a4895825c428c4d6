"""The core keeps the large blocks a call frees at its end for the next call (no page faults on
them again), up to ``FXCODEGEN_RETAIN_MB``; ``fxcodegen.release_memory()`` hands them back."""

import subprocess

import pytest
from conftest import fresh_python


def run(code: str, retain: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh process with ``FXCODEGEN_RETAIN_MB=retain`` (whatever this one has)."""
    return fresh_python(code, {"FXCODEGEN_RETAIN_MB": retain})


REUSE = """
import fxcodegen
from fxcodegen.bench import workloads
# Graphs whose blocks differ in size (some within 2x of one another, some not).
gms = [
    workloads.stitch(300).gm,
    workloads.inline(5_000).gm,
    workloads.stitch(2_500).gm,
    workloads.inline(12_000).gm,
    workloads.stitch(6_000).gm,
]
want = []
for gm in gms:
    fxcodegen.release_memory()
    want.append(fxcodegen.generate(gm).code)
fxcodegen.release_memory()
# Every order reuses blocks another graph (of another size) left behind.
for order in (range(len(gms)), reversed(range(len(gms))), [4, 0, 3, 1, 2, 4, 2]):
    for i in order:
        assert fxcodegen.generate(gms[i]).code == want[i], i
print(fxcodegen.release_memory(), fxcodegen.release_memory())
"""


def test_kept_blocks_never_change_the_code_and_are_handed_back() -> None:
    out = run(REUSE, "64")
    assert out.returncode == 0, out.stderr
    kept, after = map(int, out.stdout.split())
    assert kept > 0
    assert after == 0


def test_retain_zero_keeps_nothing() -> None:
    out = run(REUSE, "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0"]


@pytest.mark.parametrize("bad", ["lots", "-1", "1.5"])
def test_a_bad_retain_value_is_a_clear_error(bad: str) -> None:
    out = run("import fxcodegen", bad)
    assert out.returncode != 0
    assert "FXCODEGEN_RETAIN_MB must be a whole number of MiB" in out.stderr
