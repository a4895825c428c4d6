"""What a cold start has to have in hand: the distinct piece-entries of a graph, each named by
the entry key the cache stores it under and able to compile itself here. The compile layer
makes them (:func:`fxcodegen.obtain.work_items`); :mod:`fxcodegen.cache.coop` shares them out
between processes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Work"]


@dataclass
class Work:
    """One distinct piece-entry to have in hand: its key and how to compile it here."""

    key: str
    label: str
    compile: Callable[[], bytes]
    """Compiles the entry here and returns its artifact bytes."""
