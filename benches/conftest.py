"""pytest-benchmark benches for fxcodegen (not part of the ``tests/`` run).

Full run (sizes 1k, 10k, 100k; ``FXCODEGEN_BENCH_SIZES=1k,1M`` to choose)::

    pytest benches --benchmark-columns=median,rounds

Smoke run for CI (tiny graphs; every bench body runs once and real behaviour is asserted)::

    pytest benches --smoke            # or FXCODEGEN_BENCH_SMOKE=1 pytest benches

``pyproject.toml``'s ``testpaths`` keeps these out of the plain ``pytest`` run. Where the
pytest-benchmark plugin is off (``-p no:benchmark``), the ``bench`` fixture below calls each
body once instead, so the smoke run needs nothing but pytest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from fxcodegen.bench.cli import parse_sizes


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--smoke",
        action="store_true",
        default=False,
        help="run the benches once on tiny graphs (CI); also FXCODEGEN_BENCH_SMOKE=1",
    )


def smoke_mode(config: pytest.Config) -> bool:
    return bool(config.getoption("--smoke")) or os.environ.get("FXCODEGEN_BENCH_SMOKE") == "1"


def bench_sizes(config: pytest.Config) -> list[int]:
    if smoke_mode(config):
        return [40]
    return parse_sizes([os.environ.get("FXCODEGEN_BENCH_SIZES", "1k,10k,100k")])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "size" in metafunc.fixturenames:
        sizes = bench_sizes(metafunc.config)
        metafunc.parametrize("size", sizes, ids=[f"{s}n" for s in sizes], scope="module")


@pytest.fixture
def smoke(request: pytest.FixtureRequest) -> bool:
    return smoke_mode(request.config)


class _Once:
    """Stands in for pytest-benchmark's fixture when the plugin is off: one call, no timing."""

    group: str | None = None
    extra_info: dict[str, Any]

    def __init__(self) -> None:
        self.extra_info = {}

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def pedantic(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        **_: Any,
    ) -> Any:
        return fn(*args, **(kwargs or {}))


@pytest.fixture
def bench(request: pytest.FixtureRequest) -> Any:
    """pytest-benchmark's ``benchmark`` when the plugin is active, else a single call."""
    if request.config.pluginmanager.hasplugin("benchmark"):
        return request.getfixturevalue("benchmark")
    return _Once()
