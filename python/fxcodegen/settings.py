"""The backend's options, checked (:class:`fxcodegen.backend.Backend` checks them): what the
pipeline and the graph key read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fxcodegen.plan import InductorConfig
from fxcodegen.ranges import Range
from fxcodegen.split import SplittingOps

if TYPE_CHECKING:
    from fxcodegen.cache import Cache
    from fxcodegen.cache.coop import Coop

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    """One backend's checked options (see :class:`fxcodegen.backend.Backend`)."""

    splitting: SplittingOps
    compile_ranges: list[Range] | None
    compile_sizes: list[int]
    compiler: str
    inductor_config: InductorConfig
    range_dim: tuple[str, int] | None
    cache: Cache | None
    coop: Coop | None

    @property
    def splitting_ops(self) -> list[str]:
        """The canonical names of the splitting ops (what keys and logs show)."""
        return list(self.splitting.names)
