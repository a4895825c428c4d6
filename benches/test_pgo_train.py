"""The PGO training run (``benches/pgo/train.py``) keeps working: its graphs generate valid
source, the serialized path agrees with it, and its broken graph fails as it should."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import fxcodegen
import pytest

_spec = importlib.util.spec_from_file_location(
    "pgo_train", Path(__file__).parent / "pgo" / "train.py"
)
assert _spec is not None and _spec.loader is not None
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)


@pytest.mark.parametrize("make", [train.opaque_root, train.inline_root], ids=["opaque", "inline"])
@pytest.mark.parametrize("n", [30, 700, 6_000])
def test_training_graphs_generate_valid_source(make, n):
    gm = make(random.Random(n), n)
    g = fxcodegen.generate(gm)
    compile(g.code, "<pgo-train>", "exec")
    assert g.code.count("\n") >= n // 4
    code, names = fxcodegen.emit(fxcodegen.serialize(gm))
    assert (code, names) == (g.code, g.submod_names)


def test_broken_training_graph_names_the_node():
    with pytest.raises(fxcodegen.CodegenError, match='"missing_child"'):
        fxcodegen.generate(train.broken(random.Random(0)))


def test_training_run_completes_on_small_sizes(capsys):
    train.train(sizes=(30, 700), nodes_per_size=2_000)
    assert "700 nodes done" in capsys.readouterr().out


def test_training_refuses_an_extension_that_is_not_instrumented(monkeypatch):
    monkeypatch.delenv("FXCODEGEN_PGO_EXT", raising=False)
    with pytest.raises(SystemExit, match="not the instrumented extension"):
        train.main()
