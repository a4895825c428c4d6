"""The package's layering: no import cycles, and the cache imports nothing above it.

Imports are read from the source (including those under ``TYPE_CHECKING`` and
inside functions), so a cycle that only bites at type-check time or on a rare
path is caught too.
"""

import ast
from collections import Counter
from pathlib import Path

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
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
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


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1 while on the DFS stack, 2 when done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_graph_is_read():
    graph = import_graph()
    # Known edges, so an empty or broken reader cannot pass the checks below.
    assert "fxcodegen.plan" in graph["fxcodegen.pipeline"]
    assert "fxcodegen.cache.store" in graph["fxcodegen.cache"]
    assert len(graph) > 30


def test_find_cycle_detects_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None


def test_cache_imports_nothing_above_it():
    up = {
        mod: sorted(d for d in deps if not d.startswith("fxcodegen.cache"))
        for mod, deps in import_graph().items()
        if mod.startswith("fxcodegen.cache")
    }
    assert {m: d for m, d in up.items() if d} == {}


def test_module_names_are_unique():
    names = Counter(p.stem for p in PKG.rglob("*.py") if p.stem not in ("__init__", "cli"))
    assert [n for n, c in names.items() if c > 1] == []
