"""The package's layering: no import cycles, and the cache imports nothing above it.

Imports are read from the source (including those under ``TYPE_CHECKING`` and
inside functions), so a cycle that only bites at type-check time or on a rare
path is caught too.
"""

import ast
import graphlib
from collections import Counter
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "python" / "fxcodegen"


def _modules() -> dict[str, Path]:
    mods = {}
    # A `.pyi` stands for the compiled `_core`, which has no `.py`.
    for path in [*PKG.rglob("*.pyi"), *PKG.rglob("*.py")]:
        parts = ("fxcodegen",) + path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _owner(name: str, mods: dict) -> str | None:
    """The module a dotted name lives in (``fxcodegen.cache.Cache`` -> ``fxcodegen.cache``)."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0]
                    base = f"{anchor}.{base}" if base else anchor
                # `from pkg import name` needs pkg.name when that is a module, else pkg.
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                owner = _owner(name, mods)
                if owner and owner != mod:
                    deps.add(owner)
        graph[mod] = deps
    return graph


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def _in_cache(mod: str) -> bool:
    return mod == "fxcodegen.cache" or mod.startswith("fxcodegen.cache.")


def test_graph_is_read(graph):
    # Known edges, so an empty or broken reader cannot pass the checks below.
    assert "fxcodegen.plan" in graph["fxcodegen.pipeline"]
    assert "fxcodegen.cache.store" in graph["fxcodegen.cache"]
    assert len(graph) > 30


def test_no_import_cycles(graph):
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        # graphlib lists each node before the nodes that depend on it: reverse it to
        # read "imports".
        pytest.fail(f"import cycle, each imports the next: {' -> '.join(reversed(e.args[1]))}")


def test_cache_imports_nothing_above_it(graph):
    up = {
        mod: sorted(d for d in deps if not _in_cache(d))
        for mod, deps in graph.items()
        if _in_cache(mod)
    }
    assert {m: d for m, d in up.items() if d} == {}


def test_module_names_are_unique():
    names = Counter(p.stem for p in PKG.rglob("*.py") if p.stem not in ("__init__", "cli"))
    assert [n for n, c in names.items() if c > 1] == []
