"""The core keeps the large blocks a call frees at its end for the next call (no page faults on
them again), up to ``FXCODEGEN_RETAIN_MB``; ``fxcodegen.release_memory()`` hands them back."""

import os
import subprocess
import sys

import fxcodegen
import pytest
from fxcodegen.bench import workloads


def graphs() -> list:
    """Graphs whose blocks differ in size (some within 2x of one another, some not)."""
    return [
        workloads.stitch(300).gm,
        workloads.inline(5_000).gm,
        workloads.stitch(2_500).gm,
        workloads.inline(12_000).gm,
        workloads.stitch(6_000).gm,
    ]


def test_kept_blocks_never_change_the_code() -> None:
    gms = graphs()
    want = []
    for gm in gms:
        fxcodegen.release_memory()
        want.append(fxcodegen.generate(gm).code)
    fxcodegen.release_memory()
    # Every order reuses blocks another graph (of another size) left behind.
    for order in (range(len(gms)), reversed(range(len(gms))), [4, 0, 3, 1, 2, 4, 2]):
        for i in order:
            assert fxcodegen.generate(gms[i]).code == want[i]


def test_release_memory_hands_back_what_a_large_call_kept() -> None:
    gm = workloads.stitch(6_000).gm
    fxcodegen.release_memory()
    fxcodegen.generate(gm)
    assert fxcodegen.release_memory() > 0
    assert fxcodegen.release_memory() == 0


def run(code: str, retain: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "FXCODEGEN_RETAIN_MB": retain},
        capture_output=True,
        text=True,
        check=False,
    )


def test_retain_zero_keeps_nothing() -> None:
    code = (
        "import fxcodegen; from fxcodegen.bench import workloads;"
        "fxcodegen.generate(workloads.stitch(6_000).gm);"
        "print(fxcodegen.release_memory())"
    )
    kept = {retain: run(code, retain) for retain in ("0", "64")}
    assert kept["0"].returncode == 0, kept["0"].stderr
    assert kept["64"].returncode == 0, kept["64"].stderr
    assert int(kept["0"].stdout) == 0
    assert int(kept["64"].stdout) > 0


@pytest.mark.parametrize("bad", ["lots", "-1", "1.5"])
def test_a_bad_retain_value_is_a_clear_error(bad: str) -> None:
    out = run("import fxcodegen", bad)
    assert out.returncode != 0
    assert "FXCODEGEN_RETAIN_MB must be a whole number of MiB" in out.stderr
